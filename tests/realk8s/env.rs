//! The fleet every scenario shares: a manager control plane and two worker control planes,
//! fake kubelets publishing the workers' GPU nodes, and two `switchyard serve --role manager`
//! replicas installed as the chart installs them.
//!
//! - The manager: the CRDs from `switchyard crds`; the chart's manager RBAC (role `manager`),
//!   under which both replicas run with a token of its ServiceAccount; the chart's webhook
//!   configurations with `clientConfig.url` pointing at a loopback relay standing in for the
//!   Service, and the `caBundle` of `switchyard certs`; the Job controller (it must leave
//!   Switchyard's Jobs alone); two kube-schedulers whose extender is Switchyard, one with
//!   `nodeCacheCapable: true`, one without.
//! - Workers `w1` (four nodes of 8 GPUs in two NUMA zones, two in each of the topology zones
//!   `z1` and `z2`) and `w2` (one node of 4 GPUs in two NUMA zones, no topology zone), each with the chart's worker RBAC, registered by `switchyard register-worker`
//!   (a Secret holding a kubeconfig with the token of the worker role's ServiceAccount, and the
//!   WorkerCluster).
//! - JobSets: the JobSet CRD in every cluster before Switchyard starts, the chart rendered with
//!   `jobset.enabled=true` (its JobSet RBAC and webhooks) and Switchyard run with
//!   `jobsets: true`; the real JobSet controller in every cluster once a JobSet scenario asks
//!   ([`Env::start_jobset_controllers`]).
//! - Kueue: worker `w3` (one node of 16 CPUs, no GPU) runs the real Kueue controller manager
//!   and is registered with `spec.kueue.localQueueName: switchyard`, its worker install
//!   rendered with `kueue.enabled=true`; started, registered and waited for when a Kueue
//!   scenario first asks ([`Env::kueue_worker`]), so the other scenarios never wait for it.

use crate::helm;
use crate::k8s::control_plane::{ControlPlane, Options};
use crate::k8s::jobset;
use crate::k8s::kubelet::{FakeKubelet, NodeSpec};
use crate::k8s::objects::{self, apply};
use crate::k8s::process::Process;
use crate::k8s::service::Service;
use crate::k8s::{eventually, free_port, Assets};
use base64::Engine;
use futures::FutureExt;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

pub const NS: &str = "switchyard-system";
pub const WORKERS: [&str; 2] = ["w1", "w2"];
/// The worker that runs Kueue, and the LocalQueue its copies enter in every namespace.
pub const KUEUE_WORKER: &str = "w3";
pub const KUEUE_LOCAL_QUEUE: &str = "switchyard";
/// The kube-scheduler profiles of the manager whose extender is Switchyard.
pub const SCHEDULER_CACHE: &str = "switchyard-cache";
pub const SCHEDULER_NO_CACHE: &str = "switchyard-nocache";

pub struct Worker {
    pub name: &'static str,
    pub plane: ControlPlane,
    _kubelet: FakeKubelet,
}

/// One `switchyard serve` replica.
pub struct Replica {
    pub name: String,
    pub process: Process,
    pub https: SocketAddr,
    pub probe: SocketAddr,
}

pub struct Env {
    pub dir: PathBuf,
    pub manager: ControlPlane,
    pub workers: Vec<Worker>,
    pub replicas: Mutex<Vec<Replica>>,
    pub service: Service,
    /// The manager kubeconfig the replicas run with (the chart's ServiceAccount's token).
    switchyard_kubeconfig: PathBuf,
    certs: PathBuf,
    /// Held for writing by a scenario that needs the fleet to itself (killing a replica);
    /// every other scenario holds it for reading.
    pub exclusive: tokio::sync::RwLock<()>,
    /// Held for writing while w2 is partitioned; for reading by scenarios that need w2 as it
    /// normally is.
    pub w2_steady: tokio::sync::RwLock<()>,
    /// `w3`, with Kueue, once a scenario asked for it (or why it did not start).
    kueue_worker: tokio::sync::OnceCell<Result<Worker, String>>,
    assets: Assets,
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn switchyard() -> std::process::Command {
    std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
}

/// The node label of a node's topology zone.
pub const ZONE: &str = "topology.kubernetes.io/zone";

/// The topology zone of node `name` of w1: `z1` for its first two nodes, `z2` for the others.
pub fn w1_zone(name: &str) -> &'static str {
    match name {
        "w1-gpu-0" | "w1-gpu-1" => "z1",
        _ => "z2",
    }
}

fn gpu_node(name: &str, cpus: i64, memory_gi: i64, gpus: i64) -> NodeSpec {
    let mut spec = NodeSpec::new(name, cpus, memory_gi, gpus, 2);
    spec.labels.insert("gpu-model".into(), "a100".into());
    spec
}

/// The chart's values for this fleet: no cert-manager here, the CA of `switchyard certs`;
/// JobSets on (their RBAC and webhooks), as every cluster has the JobSet CRD; with `kueue`,
/// read access to the worker's Kueue objects.
fn chart_values(role: &str, ca_bundle: &str, kueue: bool) -> Value {
    json!({
        "role": role,
        "certManager": {"enabled": false},
        "tls": {"secretName": "switchyard-tls", "caBundle": ca_bundle},
        "jobset": {"enabled": true},
        "kueue": {"enabled": kueue},
    })
}

/// A plain HTTP GET on loopback; the status code.
pub async fn http_status(addr: SocketAddr, path: &str) -> Result<u16, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    tcp.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .map_err(|e| e.to_string())?;
    let mut reply = Vec::new();
    tcp.read_to_end(&mut reply)
        .await
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&reply);
    text.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("not an HTTP reply: {text}"))
}

/// A POST of JSON over HTTPS to `addr`, trusting only `ca_pem`; the reply's JSON.
pub async fn https_post_json(
    addr: SocketAddr,
    ca_pem: &[u8],
    path: &str,
    body: &Value,
) -> Result<Value, String> {
    use http_body_util::{BodyExt, Full};
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem) {
        roots
            .add(c.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(ServerName::try_from("127.0.0.1").expect("a name"), tcp)
        .await
        .map_err(|e| e.to_string())?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let request = hyper::Request::post(path)
        .header("host", "127.0.0.1")
        .header("content-type", "application/json")
        .body(Full::new(hyper::body::Bytes::from(body.to_string())))
        .map_err(|e| e.to_string())?;
    let reply = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    let bytes = reply
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    serde_json::from_slice(&bytes).map_err(|e| format!("not JSON: {e}"))
}

impl Env {
    pub async fn start(assets: &Assets, dir: &Path) -> Result<Self, String> {
        let service = Service::start().await?;
        let certs = dir.join("switchyard-certs");
        let out = switchyard()
            .args(["certs", "--out"])
            .arg(&certs)
            .args(["--ip", "127.0.0.1", "--dns", "localhost"])
            .output()
            .map_err(|e| format!("switchyard certs: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "switchyard certs: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let ca_pem = std::fs::read(certs.join("ca.crt")).map_err(|e| e.to_string())?;
        let ca_bundle = b64(&ca_pem);
        let rendered = tokio::task::spawn_blocking({
            let ca_bundle = ca_bundle.clone();
            move || {
                Ok::<_, String>((
                    helm::render(&chart_values("manager", &ca_bundle, false))?,
                    helm::render(&chart_values("worker", &ca_bundle, false))?,
                ))
            }
        });
        let options = |name: &str| Options {
            name: name.into(),
            controller_manager: true,
            scheduler: name != "manager",
        };
        let (dm, d1, d2) = (dir.join("manager"), dir.join("w1"), dir.join("w2"));
        let (mut manager, w1, w2) = tokio::try_join!(
            ControlPlane::start(assets, &dm, options("manager")),
            ControlPlane::start(assets, &d1, options("w1")),
            ControlPlane::start(assets, &d2, options("w2")),
        )?;
        let (manager_chart, worker_chart) = rendered.await.map_err(|e| e.to_string())??;
        // The JobSet API in every cluster before Switchyard starts; the JobSet controllers
        // only when a JobSet scenario asks (`start_jobset_controllers`).
        tokio::try_join!(
            jobset::install_crd(&manager.admin),
            jobset::install_crd(&w1.admin),
            jobset::install_crd(&w2.admin),
        )?;

        // The extender under the manager's kube-scheduler, reached through the relay.
        for (label, profile, cache) in [
            ("kube-scheduler-cache", SCHEDULER_CACHE, true),
            ("kube-scheduler-nocache", SCHEDULER_NO_CACHE, false),
        ] {
            manager.add_scheduler(
                label,
                json!({
                    "profiles": [{"schedulerName": profile}],
                    "extenders": [{
                        "urlPrefix": format!("https://127.0.0.1:{}/scheduler", service.addr.port()),
                        "filterVerb": "filter",
                        "prioritizeVerb": "prioritize",
                        "weight": 5,
                        "enableHTTPS": true,
                        "tlsConfig": {"caData": ca_bundle},
                        "nodeCacheCapable": cache,
                        "httpTimeout": "5s",
                        "ignorable": false,
                    }],
                }),
            )?;
        }

        let admin = manager.admin.clone();
        for doc in objects::yaml_documents(&crds_text()?)? {
            apply(&admin, &doc, false).await?;
        }
        for crd in [
            "workerclusters.switchyard.dev",
            "dispatchqueues.switchyard.dev",
        ] {
            objects::wait_established(&admin, crd, Duration::from_secs(30)).await;
        }
        apply(&admin, &namespace(NS), false).await?;
        for (path, object) in &manager_chart {
            if path.ends_with("templates/rbac.yaml") {
                apply(&admin, object, false).await?;
            }
        }
        let token = service_account_token(&admin, "switchyard").await?;
        let switchyard_kubeconfig = dir.join("switchyard.kubeconfig");
        std::fs::write(
            &switchyard_kubeconfig,
            manager.token_kubeconfig("manager", &token),
        )
        .map_err(|e| e.to_string())?;

        let mut workers = Vec::new();
        for (name, plane) in [("w1", w1), ("w2", w2)] {
            let nodes = if name == "w1" {
                (0..4)
                    .map(|i| {
                        let mut node = gpu_node(&format!("w1-gpu-{i}"), 32, 128, 8);
                        let zone = w1_zone(&node.name).to_string();
                        node.labels.insert(ZONE.into(), zone);
                        node
                    })
                    .collect()
            } else {
                vec![gpu_node("w2-gpu-0", 16, 64, 4)]
            };
            let worker = register_worker(&admin, name, plane, nodes, &worker_chart, None).await?;
            workers.push(worker);
        }

        let env = Self {
            dir: dir.to_path_buf(),
            manager,
            workers,
            replicas: Mutex::new(Vec::new()),
            service,
            switchyard_kubeconfig,
            certs,
            exclusive: Default::default(),
            w2_steady: Default::default(),
            kueue_worker: Default::default(),
            assets: assets.clone(),
        };
        for name in ["switchyard-a", "switchyard-b"] {
            let replica = env.start_replica(name)?;
            env.replicas.lock().unwrap().push(replica);
        }
        env.wait_replicas_ready().await;
        env.route_to_replicas();

        // The chart's webhooks, pointed at the relay.
        for (path, object) in &manager_chart {
            if path.ends_with("templates/webhooks.yaml") {
                let mut object = object.clone();
                for hook in object["webhooks"].as_array_mut().into_iter().flatten() {
                    let path = hook["clientConfig"]["service"]["path"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string();
                    hook["clientConfig"] = json!({
                        "url": format!("https://127.0.0.1:{}{path}", env.service.addr.port()),
                        "caBundle": ca_bundle,
                    });
                }
                apply(&admin, &object, false).await?;
            }
        }
        for w in WORKERS {
            env.wait_worker_active(w, Duration::from_secs(90)).await;
        }
        env.wait_replicas_settled().await;
        Ok(env)
    }

    /// Runs the real JobSet controller in the manager and in every worker (once; later calls
    /// return at once).
    pub async fn start_jobset_controllers(&self) {
        let started = futures::future::try_join_all(
            std::iter::once(&self.manager)
                .chain(self.workers.iter().map(|w| &w.plane))
                .map(|p| p.start_jobset_controller()),
        )
        .await;
        if let Err(e) = started {
            panic!("the JobSet controllers did not start: {e}");
        }
    }

    /// Worker `w3`, running the real Kueue controller manager, registered as a Kueue worker
    /// whose copies enter LocalQueue `switchyard`: started the first time a scenario asks.
    /// Its nodes (16 CPUs, no GPU) hold no gang the GPU scenarios look for, and no queue but
    /// those of the Kueue scenarios lists it.
    pub async fn kueue_worker(&self) -> &Worker {
        let started = self
            .kueue_worker
            .get_or_init(|| async {
                AssertUnwindSafe(self.start_kueue_worker())
                    .catch_unwind()
                    .await
                    .unwrap_or_else(|p| Err(crate::panic_text(p)))
            })
            .await;
        match started {
            Ok(w) => w,
            Err(e) => panic!("the Kueue worker {KUEUE_WORKER} did not start: {e}"),
        }
    }

    async fn start_kueue_worker(&self) -> Result<Worker, String> {
        let ca_pem = std::fs::read(self.certs.join("ca.crt")).map_err(|e| e.to_string())?;
        let rendered = tokio::task::spawn_blocking(move || {
            helm::render(&chart_values("worker", &b64(&ca_pem), true))
        });
        let options = Options {
            name: KUEUE_WORKER.into(),
            controller_manager: true,
            scheduler: true,
        };
        let plane =
            ControlPlane::start(&self.assets, &self.dir.join(KUEUE_WORKER), options).await?;
        let chart = rendered.await.map_err(|e| e.to_string())??;
        // The JobSet API as in the other workers (the replicas watch JobSets everywhere); so
        // Kueue manages JobSets too there.
        jobset::install_crd(&plane.admin).await?;
        plane.start_kueue_controller().await?;
        let nodes = vec![NodeSpec::new("w3-cpu-0", 16, 64, 0, 2)];
        let worker = register_worker(
            &self.manager.admin,
            KUEUE_WORKER,
            plane,
            nodes,
            &chart,
            Some(KUEUE_LOCAL_QUEUE),
        )
        .await?;
        self.wait_worker_active(KUEUE_WORKER, Duration::from_secs(90))
            .await;
        Ok(worker)
    }

    /// Starts `switchyard serve --role manager` as `name` (its POD_NAME, hence its leader
    /// identity), on free loopback ports.
    pub fn start_replica(&self, name: &str) -> Result<Replica, String> {
        let https: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let probe: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let config = self.dir.join(format!("{name}.yaml"));
        let text = json!({
            "role": "manager",
            "namespace": NS,
            "listen": https.to_string(),
            "probeListen": probe.to_string(),
            "tlsCert": self.certs.join("tls.crt"),
            "tlsKey": self.certs.join("tls.key"),
            "logFormat": "text",
            "log": "info",
            // Short, so a killed leader is replaced within seconds.
            "leaderElection": {"leaseDuration": "6s", "renewDeadline": "4s", "retryPeriod": "1s"},
            "shutdownTimeout": "2s",
            // As the chart's ConfigMap says with jobset.enabled=true.
            "jobsets": true,
        });
        std::fs::write(&config, text.to_string()).map_err(|e| e.to_string())?;
        let mut command = switchyard();
        command
            .args(["serve", "--config"])
            .arg(&config)
            .env("KUBECONFIG", &self.switchyard_kubeconfig)
            .env("POD_NAME", name)
            .env_remove("SWITCHYARD_LOG")
            .env_remove("RUST_LOG");
        let process = Process::spawn(name, command, &self.dir.join(format!("{name}.log")))?;
        Ok(Replica {
            name: name.to_string(),
            process,
            https,
            probe,
        })
    }

    pub async fn wait_replicas_ready(&self) {
        let probes: Vec<(String, SocketAddr)> = self
            .replicas
            .lock()
            .unwrap()
            .iter()
            .map(|r| (r.name.clone(), r.probe))
            .collect();
        for (name, probe) in probes {
            eventually(
                &format!("{name}'s /readyz"),
                Duration::from_secs(60),
                || async move {
                    match http_status(probe, "/readyz").await {
                        Ok(200) => Ok(()),
                        other => Err(format!("{other:?}")),
                    }
                },
            )
            .await;
        }
    }

    /// Waits until every replica's extender judges both workers' virtual nodes from a loaded
    /// inventory (a replica that has just started says their inventory is not loaded yet),
    /// so scenarios after a restart meet the fleet as it normally is.
    pub async fn wait_replicas_settled(&self) {
        let ca = std::fs::read(self.certs.join("ca.crt")).expect("the CA of switchyard certs");
        let replicas: Vec<(String, SocketAddr)> = self
            .replicas
            .lock()
            .unwrap()
            .iter()
            .map(|r| (r.name.clone(), r.https))
            .collect();
        let probe = json!({
            "Pod": {"metadata": {"name": "settled", "namespace": "default", "uid": "settled"},
                    "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}},
            "NodeNames": WORKERS.iter().map(|w| format!("switchyard-{w}")).collect::<Vec<_>>(),
        });
        for (name, addr) in replicas {
            let (ca, probe) = (&ca, &probe);
            eventually(
                &format!("{name}'s extender judging every worker from a loaded inventory"),
                Duration::from_secs(60),
                || async move {
                    let reply = https_post_json(addr, ca, "/scheduler/filter", probe).await?;
                    if reply["NodeNames"].as_array().map(Vec::len) == Some(WORKERS.len()) {
                        Ok(())
                    } else {
                        Err(reply.to_string())
                    }
                },
            )
            .await;
        }
    }

    /// The relay sends the API server and kube-scheduler to every replica.
    pub fn route_to_replicas(&self) {
        let backends = self
            .replicas
            .lock()
            .unwrap()
            .iter()
            .map(|r| r.https)
            .collect();
        self.service.set_backends(backends);
    }

    pub fn worker(&self, name: &str) -> &Worker {
        self.workers
            .iter()
            .chain(self.kueue_worker.get().and_then(|w| w.as_ref().ok()))
            .find(|w| w.name == name)
            .unwrap_or_else(|| panic!("no worker {name}"))
    }

    /// The replica holding the leader Lease (its POD_NAME), if any.
    pub async fn leader(&self) -> Option<String> {
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
            Api::namespaced(self.manager.admin.clone(), NS);
        let lease = leases.get_opt("switchyard-leader").await.ok()??;
        let holder = lease.spec?.holder_identity?;
        Some(
            holder
                .rsplit_once('_')
                .map_or(holder.clone(), |(pod, _)| pod.to_string()),
        )
    }

    pub async fn wait_worker_active(&self, name: &str, timeout: Duration) {
        let api = worker_clusters(&self.manager.admin);
        eventually(
            &format!("WorkerCluster {name} Active=True"),
            timeout,
            || {
                let api = api.clone();
                async move {
                    let wc = api.get(name).await.map_err(|e| e.to_string())?;
                    let active = condition(&wc.data, "Active");
                    if active["status"] == "True" {
                        Ok(())
                    } else {
                        Err(active.to_string())
                    }
                }
            },
        )
        .await;
    }

    /// Namespace `name` in the manager and in `workers` (`w3` once started).
    pub async fn namespace(&self, name: &str, workers: &[&str]) {
        apply(&self.manager.admin, &namespace(name), false)
            .await
            .expect("a namespace in the manager");
        for w in workers {
            apply(&self.worker(w).plane.admin, &namespace(name), false)
                .await
                .expect("a namespace in a worker");
        }
    }

    /// A DispatchQueue `name` for the Jobs of namespace `name`, on `clusters`, with `extra`
    /// merged into its spec.
    pub async fn queue(&self, name: &str, clusters: &[&str], extra: Value) {
        let mut spec = json!({
            "clusters": clusters,
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": name}},
        });
        for (k, v) in extra.as_object().into_iter().flatten() {
            spec[k] = v.clone();
        }
        let queue = json!({
            "apiVersion": "switchyard.dev/v1alpha1",
            "kind": "DispatchQueue",
            "metadata": {"name": name},
            "spec": spec,
        });
        apply(&self.manager.admin, &queue, false)
            .await
            .expect("a DispatchQueue");
    }

    /// The end of every replica's log, for a failure message.
    pub fn replica_logs(&self, lines: usize) -> String {
        self.replicas
            .lock()
            .unwrap()
            .iter()
            .map(|r| {
                format!(
                    "--- {} ({}):\n{}\n",
                    r.name,
                    r.process.log_path().display(),
                    r.process.log_tail(lines)
                )
            })
            .collect()
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        // Switchyard first, so it does not log its API servers going away; then the control
        // planes (and the fake kubelets) as the fields drop.
        self.replicas.lock().unwrap().clear();
    }
}

pub fn namespace(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
}

pub fn worker_clusters(client: &Client) -> Api<kube::core::DynamicObject> {
    Api::all_with(
        client.clone(),
        &kube::core::ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("switchyard.dev", "v1alpha1", "WorkerCluster"),
            "workerclusters",
        ),
    )
}

/// The condition `type_` of an object's status (`null` when absent).
pub fn condition(object: &Value, type_: &str) -> Value {
    object["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
        .cloned()
        .unwrap_or(Value::Null)
}

fn crds_text() -> Result<String, String> {
    let out = switchyard()
        .arg("crds")
        .output()
        .map_err(|e| format!("switchyard crds: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "switchyard crds: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    String::from_utf8(out.stdout).map_err(|e| e.to_string())
}

/// A token for ServiceAccount `switchyard-system/name` (TokenRequest, a day long).
async fn service_account_token(client: &Client, name: &str) -> Result<String, String> {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), NS);
    let request: TokenRequest = serde_json::from_value(json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 86400},
    }))
    .map_err(|e| e.to_string())?;
    let made = api
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .map_err(|e| format!("a token for ServiceAccount {NS}/{name}: {e}"))?;
    made.status
        .map(|s| s.token)
        .ok_or_else(|| format!("no token for ServiceAccount {NS}/{name}"))
}

/// A worker as the README registers one: the chart's worker role (its dispatcher
/// ServiceAccount, the long-lived token Secret and their RBAC), then `switchyard
/// register-worker` with the worker's admin kubeconfig, its output applied to the manager (the
/// kubeconfig Secret and the WorkerCluster, with `spec.kueue.localQueueName` when the worker
/// runs Kueue).
async fn register_worker(
    manager: &Client,
    name: &'static str,
    plane: ControlPlane,
    nodes: Vec<NodeSpec>,
    chart: &[(String, Value)],
    kueue_local_queue: Option<&str>,
) -> Result<Worker, String> {
    let admin = plane.admin.clone();
    let nrt_crd = include_str!("../../e2e/nrt-crd.yaml");
    objects::apply_yaml(&admin, nrt_crd).await?;
    objects::wait_established(
        &admin,
        "noderesourcetopologies.topology.node.k8s.io",
        Duration::from_secs(30),
    )
    .await;
    let kubelet = FakeKubelet::start(admin.clone(), nodes).await?;
    apply(&admin, &namespace(NS), false).await?;
    for (path, object) in chart {
        if path.ends_with("templates/worker-access.yaml") {
            apply(&admin, object, false).await?;
        }
    }
    let tier = match name {
        "w1" => "gold",
        "w2" => "silver",
        _ => "bronze",
    };
    let mut command = switchyard();
    command
        .arg("register-worker")
        .arg(name)
        .arg("--kubeconfig")
        .arg(&plane.admin_kubeconfig)
        .args(["--namespace", NS, "--label", &format!("tier={tier}")])
        .args(["--wait", "60"]);
    if let Some(q) = kueue_local_queue {
        command.args(["--kueue-local-queue", q]);
    }
    let out = tokio::task::spawn_blocking(move || command.output())
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("switchyard register-worker {name}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "switchyard register-worker {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let printed = String::from_utf8_lossy(&out.stdout);
    let documents: Vec<Value> = serde_yaml::Deserializer::from_str(&printed)
        .map(|d| serde::Deserialize::deserialize(d).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    let kinds: Vec<&str> = documents
        .iter()
        .filter_map(|d| d["kind"].as_str())
        .collect();
    if kinds != ["Secret", "WorkerCluster"] {
        return Err(format!(
            "register-worker {name} printed {kinds:?}: {printed}"
        ));
    }
    for document in &documents {
        apply(manager, document, false).await?;
    }
    Ok(Worker {
        name,
        plane,
        _kubelet: kubelet,
    })
}
