//! One Kubernetes control plane on loopback: etcd, kube-apiserver, and where asked
//! kube-controller-manager and kube-scheduler, with their own PKI and free ports, stopped when
//! dropped.

use super::assets::Assets;
use super::pki::{self, Ca, Pair};
use super::process::Process;
use super::{eventually, free_port};
use base64::Engine;
use serde_json::json;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The service network the API server books its `kubernetes` Service in; its first address is
/// in the serving certificate, as a cluster's is.
const SERVICE_CIDR: &str = "10.0.0.0/24";
const FIRST_SERVICE_IP: [u8; 4] = [10, 0, 0, 1];

#[derive(Debug, Clone)]
pub struct Options {
    pub name: String,
    /// kube-controller-manager: the Job controller, the garbage collector, the node lifecycle
    /// (Leases keep nodes Ready), service-account tokens.
    pub controller_manager: bool,
    /// A kube-scheduler with the default profile.
    pub scheduler: bool,
}

/// How a client authenticates, in a kubeconfig.
pub enum Credentials<'a> {
    Certificate(&'a Pair),
    Token(&'a str),
}

pub struct ControlPlane {
    pub name: String,
    pub dir: PathBuf,
    /// `https://127.0.0.1:PORT`
    pub server: String,
    pub ca_pem: String,
    /// `system:masters`.
    pub admin: kube::Client,
    pub admin_kubeconfig: PathBuf,
    ca: Ca,
    assets: Assets,
    etcd: Process,
    apiserver: Process,
    controller_manager: Option<Process>,
    schedulers: Vec<Process>,
    /// Started on demand by [`ControlPlane::start_jobset_controller`].
    jobset_controller: tokio::sync::Mutex<Option<Process>>,
    /// Started on demand by [`ControlPlane::start_kueue_controller`].
    kueue_controller: tokio::sync::Mutex<Option<Process>>,
}

fn b64(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text)
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// A kubeconfig for `server`, trusting `ca_pem`, with these credentials (JSON, which is YAML).
pub fn kubeconfig(cluster: &str, server: &str, ca_pem: &str, user: Credentials<'_>) -> String {
    let user = match user {
        Credentials::Certificate(pair) => json!({
            "client-certificate-data": b64(&pair.cert_pem),
            "client-key-data": b64(&pair.key_pem),
        }),
        Credentials::Token(token) => json!({"token": token}),
    };
    serde_json::to_string_pretty(&json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster, "cluster": {
            "server": server, "certificate-authority-data": b64(ca_pem)}}],
        "users": [{"name": "user", "user": user}],
        "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": "user"}}],
        "current-context": cluster,
    }))
    .expect("a kubeconfig serializes")
}

/// A client from a kubeconfig's text.
pub async fn client_from(kubeconfig: &str) -> Result<kube::Client, String> {
    let parsed = kube::config::Kubeconfig::from_yaml(kubeconfig)
        .map_err(|e| format!("kubeconfig does not parse: {e}"))?;
    let config = kube::Config::from_custom_kubeconfig(parsed, &Default::default())
        .await
        .map_err(|e| format!("kubeconfig is not usable: {e}"))?;
    kube::Client::try_from(config).map_err(|e| format!("cannot build a client: {e}"))
}

impl ControlPlane {
    /// Starts etcd and kube-apiserver, waits for `/readyz`, then starts what `options` asks for.
    pub async fn start(assets: &Assets, dir: &Path, options: Options) -> Result<Self, String> {
        let name = options.name.clone();
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let file = |f: &str| dir.join(f);
        let ca = Ca::new(&format!("{name}-ca"));
        let front_proxy_ca = Ca::new(&format!("{name}-front-proxy-ca"));
        let serving = ca.server(
            "kube-apiserver",
            &[
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ],
            &[IpAddr::from([127, 0, 0, 1]), IpAddr::from(FIRST_SERVICE_IP)],
        );
        let front_proxy_client = front_proxy_ca.client("front-proxy-client", &[]);
        write(&file("ca.crt"), &ca.cert_pem())?;
        write(&file("ca.key"), &ca.key_pem())?;
        write(&file("front-proxy-ca.crt"), &front_proxy_ca.cert_pem())?;
        write(&file("apiserver.crt"), &serving.cert_pem)?;
        write(&file("apiserver.key"), &serving.key_pem)?;
        write(
            &file("front-proxy-client.crt"),
            &front_proxy_client.cert_pem,
        )?;
        write(&file("front-proxy-client.key"), &front_proxy_client.key_pem)?;
        let (sa_key, sa_pub) = pki::service_account_key();
        write(&file("sa.key"), &sa_key)?;
        write(&file("sa.pub"), &sa_pub)?;
        let path = |f: &str| file(f).display().to_string();

        let (etcd_port, peer_port, api_port) = (free_port(), free_port(), free_port());
        let mut etcd = Command::new(&assets.etcd);
        let peer = format!("http://127.0.0.1:{peer_port}");
        let client_url = format!("http://127.0.0.1:{etcd_port}");
        etcd.args(["--name", &name, "--data-dir", &path("etcd")])
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("{name}={peer}")])
            // Throwaway data: no fsync makes every write much cheaper.
            .args(["--unsafe-no-fsync", "--log-level", "warn"]);
        let etcd = Process::spawn(&format!("{name} etcd"), etcd, &file("etcd.log"))?;

        let mut api = Command::new(&assets.apiserver);
        api.args(["--etcd-servers", &client_url])
            .args([
                "--bind-address",
                "127.0.0.1",
                "--advertise-address",
                "127.0.0.1",
            ])
            .args(["--secure-port", &api_port.to_string()])
            .args(["--cert-dir", &path("apiserver-certs")])
            .args(["--tls-cert-file", &path("apiserver.crt")])
            .args(["--tls-private-key-file", &path("apiserver.key")])
            .args(["--client-ca-file", &path("ca.crt")])
            .args([
                "--service-account-issuer",
                "https://kubernetes.default.svc.cluster.local",
            ])
            .args(["--service-account-key-file", &path("sa.pub")])
            .args(["--service-account-signing-key-file", &path("sa.key")])
            .args(["--service-cluster-ip-range", SERVICE_CIDR])
            .args(["--authorization-mode", "Node,RBAC"])
            // An Endpoints object may not hold a loopback address.
            .args(["--endpoint-reconciler-type", "none"])
            .args([
                "--requestheader-client-ca-file",
                &path("front-proxy-ca.crt"),
            ])
            .args(["--requestheader-allowed-names", "front-proxy-client"])
            .args(["--requestheader-username-headers", "X-Remote-User"])
            .args(["--requestheader-group-headers", "X-Remote-Group"])
            .args(["--requestheader-extra-headers-prefix", "X-Remote-Extra-"])
            .args(["--proxy-client-cert-file", &path("front-proxy-client.crt")])
            .args(["--proxy-client-key-file", &path("front-proxy-client.key")]);
        if !options.controller_manager {
            // Nothing would take the not-ready taint off new nodes again.
            api.args(["--disable-admission-plugins", "TaintNodesByCondition"]);
        }
        let apiserver = Process::spawn(
            &format!("{name} kube-apiserver"),
            api,
            &file("kube-apiserver.log"),
        )?;

        let server = format!("https://127.0.0.1:{api_port}");
        let admin_pair = ca.client("admin", &["system:masters"]);
        let admin_text = kubeconfig(
            &name,
            &server,
            &ca.cert_pem(),
            Credentials::Certificate(&admin_pair),
        );
        let admin_kubeconfig = file("admin.kubeconfig");
        write(&admin_kubeconfig, &admin_text)?;
        let admin = client_from(&admin_text).await?;
        let mut plane = Self {
            name: name.clone(),
            dir: dir.to_path_buf(),
            server,
            ca_pem: ca.cert_pem(),
            admin,
            admin_kubeconfig,
            ca,
            assets: assets.clone(),
            etcd,
            apiserver,
            controller_manager: None,
            schedulers: Vec::new(),
            jobset_controller: Default::default(),
            kueue_controller: Default::default(),
        };
        plane.wait_ready().await?;
        if options.controller_manager {
            plane.start_controller_manager().await?;
        }
        if options.scheduler {
            plane.add_scheduler("kube-scheduler", json!({}))?;
        }
        Ok(plane)
    }

    /// Waits (up to 60 s) for the API server's `/readyz`, which includes its bootstrap RBAC.
    async fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            for p in [&mut self.etcd, &mut self.apiserver] {
                if let Some(status) = p.exited() {
                    return Err(format!(
                        "{} exited ({status}) while starting; its log ends:\n{}",
                        p.name(),
                        p.log_tail(30)
                    ));
                }
            }
            let request = hyper::Request::get("/readyz")
                .body(Vec::new())
                .expect("a request");
            if self
                .admin
                .request_text(request)
                .await
                .is_ok_and(|t| t == "ok")
            {
                return Ok(());
            }
            if std::time::Instant::now() > deadline {
                return Err(format!(
                    "{}: /readyz not ok within 60 s; kube-apiserver's log ends:\n{}",
                    self.name,
                    self.apiserver.log_tail(30)
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// A kubeconfig file for a client certificate of `user`.
    fn client_kubeconfig(&self, file: &str, user: &str) -> Result<PathBuf, String> {
        let pair = self.ca.client(user, &[]);
        let path = self.dir.join(file);
        write(
            &path,
            &kubeconfig(
                &self.name,
                &self.server,
                &self.ca_pem,
                Credentials::Certificate(&pair),
            ),
        )?;
        Ok(path)
    }

    async fn start_controller_manager(&mut self) -> Result<(), String> {
        let Some(binary) = self.assets.controller_manager.clone() else {
            return Err(format!(
                "{}: kube-controller-manager is not in {}",
                self.name, self.assets.source
            ));
        };
        let kubeconfig = self
            .client_kubeconfig(
                "controller-manager.kubeconfig",
                "system:kube-controller-manager",
            )?
            .display()
            .to_string();
        let path = |f: &str| self.dir.join(f).display().to_string();
        let mut kcm = Command::new(binary);
        kcm.args(["--kubeconfig", &kubeconfig])
            .args(["--authentication-kubeconfig", &kubeconfig])
            .args(["--authorization-kubeconfig", &kubeconfig])
            .args([
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                &free_port().to_string(),
            ])
            .args(["--cert-dir", &path("controller-manager-certs")])
            .args(["--controllers", "*"])
            .args(["--service-account-private-key-file", &path("sa.key")])
            .args(["--root-ca-file", &path("ca.crt")])
            .args(["--cluster-signing-cert-file", &path("ca.crt")])
            .args(["--cluster-signing-key-file", &path("ca.key")])
            .args(["--client-ca-file", &path("ca.crt")])
            .args([
                "--requestheader-client-ca-file",
                &path("front-proxy-ca.crt"),
            ])
            .args(["--use-service-account-credentials", "--leader-elect=false"])
            // The default 20 requests per second would make a burst of Jobs crawl.
            .args(["--kube-api-qps", "200", "--kube-api-burst", "400"]);
        let process = Process::spawn(
            &format!("{} kube-controller-manager", self.name),
            kcm,
            &self.dir.join("kube-controller-manager.log"),
        )?;
        self.controller_manager = Some(process);
        // The service-account controller giving `default` its ServiceAccount shows the
        // controllers are running (and namespaces made from now on get theirs too).
        let client = self.admin.clone();
        let name = self.name.clone();
        eventually(
            &format!("{name}: kube-controller-manager creates ServiceAccount default/default"),
            Duration::from_secs(60),
            || {
                let api: kube::Api<k8s_openapi::api::core::v1::ServiceAccount> =
                    kube::Api::namespaced(client.clone(), "default");
                async move {
                    match api.get_opt("default").await {
                        Ok(Some(_)) => Ok(()),
                        Ok(None) => Err("not yet".to_string()),
                        Err(e) => Err(e.to_string()),
                    }
                }
            },
        )
        .await;
        Ok(())
    }

    /// Starts a kube-scheduler whose configuration is `config` (a KubeSchedulerConfiguration's
    /// `profiles` and `extenders`; none: the default profile) plus its connection.
    pub fn add_scheduler(&mut self, label: &str, config: serde_json::Value) -> Result<(), String> {
        let Some(binary) = self.assets.scheduler.clone() else {
            return Err(format!(
                "{}: kube-scheduler is not in {}",
                self.name, self.assets.source
            ));
        };
        let n = self.schedulers.len();
        let kubeconfig = self
            .client_kubeconfig(
                &format!("scheduler-{n}.kubeconfig"),
                "system:kube-scheduler",
            )?
            .display()
            .to_string();
        let mut file = json!({
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": kubeconfig, "qps": 200, "burst": 400},
            "leaderElection": {"leaderElect": false},
        });
        for key in ["profiles", "extenders"] {
            if let Some(v) = config.get(key) {
                file[key] = v.clone();
            }
        }
        let config_path = self.dir.join(format!("scheduler-{n}.yaml"));
        write(&config_path, &file.to_string())?;
        let mut scheduler = Command::new(binary);
        scheduler
            .arg("--config")
            .arg(&config_path)
            .args(["--authentication-kubeconfig", &kubeconfig])
            .args(["--authorization-kubeconfig", &kubeconfig])
            .args([
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                &free_port().to_string(),
            ])
            .arg("--cert-dir")
            .arg(self.dir.join(format!("scheduler-{n}-certs")));
        let process = Process::spawn(
            &format!("{} {label}", self.name),
            scheduler,
            &self.dir.join(format!("{label}.log")),
        )?;
        self.schedulers.push(process);
        Ok(())
    }

    /// Installs the JobSet CRD and webhooks and runs the JobSet controller (`assets.jobset_controller`)
    /// until this control plane stops; waits until it serves. Does nothing when it runs already.
    /// Pods of JobSets run where the fake kubelet has nodes, like any pod.
    pub async fn start_jobset_controller(&self) -> Result<(), String> {
        let mut slot = self.jobset_controller.lock().await;
        if slot.is_some() {
            return Ok(());
        }
        let Some(binary) = self.assets.jobset_controller.clone() else {
            return Err(format!(
                "{}: {}",
                self.name,
                self.assets.missing_jobset_controller().unwrap_or_default()
            ));
        };
        *slot = Some(super::jobset::start(self, &binary).await?);
        Ok(())
    }

    /// Installs the Kueue CRDs and webhooks and runs the Kueue controller manager
    /// (`assets.kueue_controller`) until this control plane stops; waits until it serves. Does
    /// nothing when it runs already. It admits suspended Jobs labelled with a LocalQueue of
    /// theirs (and JobSets, when this plane serves them); their pods run where the fake kubelet
    /// has nodes.
    pub async fn start_kueue_controller(&self) -> Result<(), String> {
        let mut slot = self.kueue_controller.lock().await;
        if slot.is_some() {
            return Ok(());
        }
        let Some(binary) = self.assets.kueue_controller.clone() else {
            return Err(format!(
                "{}: {}",
                self.name,
                self.assets.missing_kueue_controller().unwrap_or_default()
            ));
        };
        *slot = Some(super::kueue::start(self, &binary).await?);
        Ok(())
    }

    /// A client authenticated as `user` in `groups` (a client certificate of this cluster's
    /// CA), with no more rights than RBAC gives it.
    pub async fn client_as(&self, user: &str, groups: &[&str]) -> kube::Client {
        let pair = self.ca.client(user, groups);
        let text = kubeconfig(
            &self.name,
            &self.server,
            &self.ca_pem,
            Credentials::Certificate(&pair),
        );
        client_from(&text).await.expect("a client for a user")
    }

    /// A kubeconfig that authenticates with a bearer token, as a user would write one.
    pub fn token_kubeconfig(&self, cluster: &str, token: &str) -> String {
        kubeconfig(
            cluster,
            &self.server,
            &self.ca_pem,
            Credentials::Token(token),
        )
    }

    /// Stops the API server with SIGSTOP until the returned guard is dropped: its clients
    /// time out as across a lost network.
    pub fn partition(&self) -> Partition<'_> {
        self.apiserver
            .signal("STOP")
            .expect("the API server can be stopped");
        Partition { plane: self }
    }

    /// What each process logged last, for a failure message.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut out = String::new();
        let jobset = self.jobset_controller.try_lock().ok();
        let kueue = self.kueue_controller.try_lock().ok();
        let processes = [&self.etcd, &self.apiserver]
            .into_iter()
            .chain(self.controller_manager.as_ref())
            .chain(&self.schedulers)
            .chain(jobset.as_ref().and_then(|j| j.as_ref()))
            .chain(kueue.as_ref().and_then(|k| k.as_ref()));
        for p in processes {
            out.push_str(&format!(
                "--- {} ({}):\n{}\n",
                p.name(),
                p.log_path().display(),
                p.log_tail(lines)
            ));
        }
        out
    }

    /// Every process of this control plane still running.
    pub fn check_alive(&mut self) -> Result<(), String> {
        let processes = [&mut self.etcd, &mut self.apiserver]
            .into_iter()
            .chain(self.controller_manager.as_mut())
            .chain(self.schedulers.iter_mut())
            .chain(self.jobset_controller.get_mut().as_mut())
            .chain(self.kueue_controller.get_mut().as_mut());
        for p in processes {
            if let Some(status) = p.exited() {
                return Err(format!(
                    "{} exited ({status}): {}",
                    p.name(),
                    p.log_tail(20)
                ));
            }
        }
        Ok(())
    }
}

/// An API server stopped with SIGSTOP; continued when dropped, so a failing test never leaves
/// it stopped.
pub struct Partition<'a> {
    plane: &'a ControlPlane,
}

impl Partition<'_> {
    pub fn heal(self) {}
}

impl Drop for Partition<'_> {
    fn drop(&mut self) {
        let _ = self.plane.apiserver.signal("CONT");
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        // Throwaway state: SIGKILL everything, clients first so none logs the API server
        // going away, etcd last.
        if let Some(jobset) = self.jobset_controller.get_mut() {
            jobset.kill();
        }
        if let Some(kueue) = self.kueue_controller.get_mut() {
            kueue.kill();
        }
        for s in &mut self.schedulers {
            s.kill();
        }
        if let Some(kcm) = &mut self.controller_manager {
            kcm.kill();
        }
        self.apiserver.kill();
        self.etcd.kill();
    }
}
