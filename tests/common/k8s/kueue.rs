//! The Kueue API (`kueue.x-k8s.io/v1beta1`) and the real Kueue controller manager in a control
//! plane, run out of cluster as `../shared/k8s/README.md` describes: its CRDs applied
//! server-side, its webhooks registered at `https://127.0.0.1:PORT`, the controller with the
//! admin kubeconfig, no leader election, no metrics server, ready when `/readyz` says so and
//! the API server gets answers from its webhooks.
//!
//! Kueue v0.13.1 keeps internal certificate management on here: turned off, it reads its
//! metrics certificate from a fixed path under `/etc/kueue` and exits without it. So the
//! Secret its certificate rotator manages is made beforehand with a certificate valid for both
//! the Service name the rotator checks and 127.0.0.1 (the rotator then keeps it), and the same
//! pair is put in the webhook server's `certDir`, as a Secret volume would in a pod. The
//! rotator reads the CA key as PKCS#1 RSA, which rcgen (on ring) cannot make: openssl does.

use super::control_plane::ControlPlane;
use super::objects::{self, apply};
use super::process::Process;
use super::{free_port, webhooks_reachable};
use base64::Engine;
use k8s_openapi::api::batch::v1::Job;
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// The CRDs of Kueue v0.13.1 (`config/components/crd/bases`): every kind its controllers
/// watch, whether or not a test uses it.
pub const CRDS: [(&str, &str); 11] = [
    (
        "admissionchecks.kueue.x-k8s.io",
        include_str!("../../data/crds/kueue/kueue.x-k8s.io_admissionchecks.yaml"),
    ),
    (
        "clusterqueues.kueue.x-k8s.io",
        include_str!("../../data/crds/kueue/kueue.x-k8s.io_clusterqueues.yaml"),
    ),
    (
        "cohorts.kueue.x-k8s.io",
        include_str!("../../data/crds/kueue/kueue.x-k8s.io_cohorts.yaml"),
    ),
    (
        "localqueues.kueue.x-k8s.io",
        include_str!("../../data/crds/kueue/kueue.x-k8s.io_localqueues.yaml"),
    ),
    (
        "multikueueclusters.kueue.x-k8s.io",
        include_str!("../../data/crds/kueue/kueue.x-k8s.io_multikueueclusters.yaml"),
    ),
    (
        "multikueueconfigs.kueue.x-k8s.io",
        include_str!("../../data/crds/kueue/kueue.x-k8s.io_multikueueconfigs.yaml"),
    ),
    (
        "provisioningrequestconfigs.kueue.x-k8s.io",
        include_str!("../../data/crds/kueue/kueue.x-k8s.io_provisioningrequestconfigs.yaml"),
    ),
    (
        "resourceflavors.kueue.x-k8s.io",
        include_str!("../../data/crds/kueue/kueue.x-k8s.io_resourceflavors.yaml"),
    ),
    (
        "topologies.kueue.x-k8s.io",
        include_str!("../../data/crds/kueue/kueue.x-k8s.io_topologies.yaml"),
    ),
    (
        "workloadpriorityclasses.kueue.x-k8s.io",
        include_str!("../../data/crds/kueue/kueue.x-k8s.io_workloadpriorityclasses.yaml"),
    ),
    (
        "workloads.kueue.x-k8s.io",
        include_str!("../../data/crds/kueue/kueue.x-k8s.io_workloads.yaml"),
    ),
];

/// The label a Job carries to enter a LocalQueue.
pub const QUEUE_NAME_LABEL: &str = "kueue.x-k8s.io/queue-name";
/// The namespace, Secret and Service names the controller's certificate rotator uses.
const NAMESPACE: &str = "kueue-system";
const SECRET: &str = "kueue-webhook-server-cert";
const SERVICE: &str = "kueue-webhook-service";

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta1", kind),
        plural,
    )
}

pub fn cluster_queues(client: &Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &resource("ClusterQueue", "clusterqueues"))
}

pub fn local_queues(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &resource("LocalQueue", "localqueues"))
}

pub fn workloads(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &resource("Workload", "workloads"))
}

/// Applies every Kueue CRD (server-side: the Workload CRD is too big for client-side apply's
/// annotation) and waits until they are Established.
pub async fn install_crds(client: &Client) -> Result<(), String> {
    for (_, yaml) in CRDS {
        objects::apply_yaml(client, yaml).await?;
    }
    for (name, _) in CRDS {
        objects::wait_established(client, name, Duration::from_secs(30)).await;
    }
    Ok(())
}

/// A ClusterQueue `name` for the Jobs of namespace `ns` only, its one resource group covering
/// CPU and memory in flavor `default-flavor`; `stop_policy` `Hold` admits nothing new.
pub fn cluster_queue(name: &str, ns: &str, cpus: u32, memory: &str, stop_policy: &str) -> Value {
    json!({
        "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "stopPolicy": stop_policy,
            "resourceGroups": [{
                "coveredResources": ["cpu", "memory"],
                "flavors": [{"name": "default-flavor", "resources": [
                    {"name": "cpu", "nominalQuota": cpus},
                    {"name": "memory", "nominalQuota": memory}]}],
            }],
        },
    })
}

/// The queues of one namespace: ResourceFlavor `default-flavor` (shared, no node labels),
/// `cluster_queue` (see [`cluster_queue`]) and LocalQueue `ns/local_queue` pointing at it.
pub async fn queues(
    client: &Client,
    ns: &str,
    local_queue: &str,
    cluster_queue: &Value,
) -> Result<(), String> {
    let flavor = json!({
        "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ResourceFlavor",
        "metadata": {"name": "default-flavor"},
    });
    apply(client, &flavor, false).await?;
    apply(client, cluster_queue, false).await?;
    let cq = cluster_queue["metadata"]["name"]
        .as_str()
        .unwrap_or_default();
    let lq = json!({
        "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
        "metadata": {"name": local_queue, "namespace": ns},
        "spec": {"clusterQueue": cq},
    });
    apply(client, &lq, false).await?;
    Ok(())
}

/// `openssl ARGS` in `dir`.
fn openssl(dir: &Path, args: &[&str]) -> Result<(), String> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .map_err(|e| format!("cannot run openssl: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "openssl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Whether openssl can be run, for the certificates of the controller's webhooks.
pub fn openssl_available() -> Result<(), String> {
    match Command::new("openssl").arg("version").output() {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(format!("openssl version: {}", out.status)),
        Err(e) => Err(format!(
            "openssl is not on PATH ({e}); it makes the Kueue controller's RSA CA"
        )),
    }
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// The webhook CA and serving pair in `dir`: `ca.crt`, `ca.key` (PKCS#1 RSA, SAN `kueue-ca`,
/// which the rotator verifies the CA for), `tls.crt`/`tls.key` for the Service name and
/// 127.0.0.1. Ten years: the rotator renews anything that ends within 90 days.
fn certificates(dir: &Path) -> Result<(), String> {
    openssl(dir, &["genrsa", "-traditional", "-out", "ca.key", "2048"])?;
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-new",
            "-key",
            "ca.key",
            "-days",
            "3650",
            "-subj",
            "/O=kueue/CN=kueue-ca",
            "-addext",
            "subjectAltName=DNS:kueue-ca",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,digitalSignature",
            "-out",
            "ca.crt",
        ],
    )?;
    openssl(dir, &["genrsa", "-traditional", "-out", "tls.key", "2048"])?;
    let host = format!("{SERVICE}.{NAMESPACE}.svc");
    openssl(
        dir,
        &[
            "req",
            "-new",
            "-key",
            "tls.key",
            "-subj",
            &format!("/CN={host}"),
            "-out",
            "tls.csr",
        ],
    )?;
    std::fs::write(
        dir.join("ext.cnf"),
        format!("subjectAltName=DNS:{host},IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"),
    )
    .map_err(|e| format!("{}: {e}", dir.display()))?;
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "tls.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "3650",
            "-extfile",
            "ext.cnf",
            "-out",
            "tls.crt",
        ],
    )
}

/// The controller's webhooks for Jobs, JobSets and its own kinds (`config/components/webhook`
/// without those of the other frameworks, which would make every pod creation call it), at
/// `port` on loopback. The names of both configurations are fixed: the rotator injects its CA
/// into them and the controllers do not start until they exist.
fn webhooks(port: u16, ca_bundle: &str) -> [Value; 2] {
    let hook = |name: &str,
                path: &str,
                group: &str,
                version: &str,
                resources: &[&str],
                ops: &[&str]| {
        json!({
            "name": name,
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "clientConfig": {"url": format!("https://127.0.0.1:{port}{path}"), "caBundle": ca_bundle},
            "rules": [{"apiGroups": [group], "apiVersions": [version], "operations": ops,
                       "resources": resources}],
        })
    };
    let kueue = |verb: &str, kind: &str| {
        let plural = format!("{kind}s");
        hook(
            &format!("{}{kind}.kb.io", &verb[..1]),
            &format!("/{verb}-kueue-x-k8s-io-v1beta1-{kind}"),
            "kueue.x-k8s.io",
            "v1beta1",
            &[plural.as_str()],
            if verb == "mutate" {
                &["CREATE"]
            } else {
                &["CREATE", "UPDATE"]
            },
        )
    };
    let mut vworkload = kueue("validate", "workload");
    vworkload["rules"][0]["resources"] = json!(["workloads", "workloads/status"]);
    [
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "kueue-mutating-webhook-configuration"},
            "webhooks": [
                hook("mjob.kb.io", "/mutate-batch-v1-job", "batch", "v1", &["jobs"], &["CREATE"]),
                hook("mjobset.kb.io", "/mutate-jobset-x-k8s-io-v1alpha2-jobset", "jobset.x-k8s.io", "v1alpha2", &["jobsets"], &["CREATE"]),
                kueue("mutate", "clusterqueue"),
                kueue("mutate", "resourceflavor"),
                kueue("mutate", "workload"),
            ],
        }),
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "kueue-validating-webhook-configuration"},
            "webhooks": [
                hook("vjob.kb.io", "/validate-batch-v1-job", "batch", "v1", &["jobs"], &["CREATE", "UPDATE"]),
                hook("vjobset.kb.io", "/validate-jobset-x-k8s-io-v1alpha2-jobset", "jobset.x-k8s.io", "v1alpha2", &["jobsets"], &["CREATE", "UPDATE"]),
                kueue("validate", "clusterqueue"),
                kueue("validate", "cohort"),
                kueue("validate", "resourceflavor"),
                vworkload,
            ],
        }),
    ]
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Installs the CRDs, the rotator's Secret and the webhooks in `plane`, starts `binary` and
/// waits until it serves. Kueue manages batch/v1 Jobs with a queue-name label, and JobSets
/// too when the plane serves the JobSet API.
pub(super) async fn start(plane: &ControlPlane, binary: &Path) -> Result<Process, String> {
    let name = &plane.name;
    install_crds(&plane.admin).await?;
    let dir = plane.dir.join("kueue-controller");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let certs = dir.clone();
    tokio::task::spawn_blocking(move || certificates(&certs))
        .await
        .map_err(|e| e.to_string())??;
    let b64 = |f: &str| -> Result<String, String> {
        Ok(base64::engine::general_purpose::STANDARD.encode(read(&dir.join(f))?))
    };
    apply(
        &plane.admin,
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}),
        false,
    )
    .await?;
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": SECRET, "namespace": NAMESPACE},
        "data": {"ca.crt": b64("ca.crt")?, "ca.key": b64("ca.key")?,
                 "tls.crt": b64("tls.crt")?, "tls.key": b64("tls.key")?},
    });
    apply(&plane.admin, &secret, false).await?;
    let (webhook, health) = (free_port(), free_port());
    for object in webhooks(webhook, &b64("ca.crt")?) {
        apply(&plane.admin, &object, false).await?;
    }
    let mut frameworks = vec!["batch/job"];
    if objects::api_for(
        &plane.admin,
        &json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet"}),
    )
    .await
    .is_ok()
    {
        frameworks.push("jobset.x-k8s.io/jobset");
    }
    let config = json!({
        "apiVersion": "config.kueue.x-k8s.io/v1beta1",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "internalCertManagement": {"enable": true, "webhookServiceName": SERVICE,
                                   "webhookSecretName": SECRET},
        "webhook": {"host": "127.0.0.1", "port": webhook, "certDir": dir},
        // No metrics server: nothing scrapes it, and its certificate watcher would take one
        // more of the inotify instances every process of the user shares.
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": format!("127.0.0.1:{health}")},
        "leaderElection": {"leaderElect": false},
        "clientConnection": {"qps": 50, "burst": 100},
        "manageJobsWithoutQueueName": false,
        "managedJobsNamespaceSelector": {"matchExpressions": [{
            "key": "kubernetes.io/metadata.name", "operator": "NotIn",
            "values": ["kube-system", NAMESPACE]}]},
        // On by default, it would start an aggregated API server on 0.0.0.0:8082.
        "featureGates": {"VisibilityOnDemand": false},
        "integrations": {"frameworks": frameworks},
    });
    let config_path = dir.join("config.yaml");
    write(&config_path, &config.to_string())?;
    let mut command = Command::new(binary);
    command
        .arg("--kubeconfig")
        .arg(&plane.admin_kubeconfig)
        .arg("--config")
        .arg(&config_path);
    let mut process = Process::spawn(
        &format!("{name} kueue-controller"),
        command,
        &plane.dir.join("kueue-controller.log"),
    )?;
    let health: SocketAddr = ([127, 0, 0, 1], health).into();
    process.ready(health).await?;
    // Ready is not yet reachable: a dry-run create goes through both Job webhooks.
    let probe: Job = serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "kueue-webhook-probe", "namespace": "default",
                     "labels": {QUEUE_NAME_LABEL: "probe"}},
        "spec": {"suspend": true, "template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "c", "image": "busybox:1.36"}]}}},
    }))
    .expect("a Job");
    webhooks_reachable(
        &format!("{name}'s Kueue controller"),
        Api::<Job>::namespaced(plane.admin.clone(), "default"),
        probe,
    )
    .await;
    Ok(process)
}
