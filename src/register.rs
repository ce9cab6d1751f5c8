//! `switchyard register-worker`: what the manager needs to reach a worker, read from the worker.
//!
//! The worker's chart makes the dispatcher's ServiceAccount and a long-lived token Secret for it
//! (`templates/worker-access.yaml`). This command reads that Secret with the user's own
//! credentials for the worker, turns the token into a kubeconfig the manager accepts (a token and
//! embedded CA data, nothing that reads files or runs programs), checks that the kubeconfig
//! reaches the worker with that token, and prints the two objects the manager then needs: the
//! kubeconfig Secret and the WorkerCluster pointing to it. Applying them is left to
//! `kubectl apply` against the manager, so this command never needs the manager's credentials
//! and the user sees what is applied.

use crate::api::{validate_worker_cluster, WorkerClusterSpec};
use crate::workers::kubeconfig::{check, client_for, ClientOptions};
use anyhow::{anyhow, bail, Context as _};
use base64::Engine as _;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The Secret the worker chart creates for the dispatcher's token (`<fullname>-dispatcher-token`
/// for a release named `switchyard`).
pub const DEFAULT_TOKEN_SECRET: &str = "switchyard-dispatcher-token";

/// The WorkerCluster to make: its name and the spec fields the command sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Worker {
    /// The WorkerCluster's name; the kubeconfig Secret is `<name>-kubeconfig`.
    pub name: String,
    /// `spec.schedulerName`: the worker's second scheduler, if it runs one.
    pub scheduler_name: Option<String>,
    /// `spec.labels`.
    pub labels: BTreeMap<String, String>,
    /// `spec.kueue.localQueueName`: the worker runs Kueue, and copies enter this LocalQueue.
    pub kueue_local_queue: Option<String>,
}

impl Worker {
    fn secret_name(&self) -> String {
        format!("{}-kubeconfig", self.name)
    }

    /// The WorkerCluster object, or what the manager's API server would refuse in it.
    pub fn object(&self) -> Result<Value, String> {
        if !crate::api::names::is_dns1123_subdomain(&self.name) {
            return Err(format!(
                "{:?} is not a WorkerCluster name: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit",
                self.name
            ));
        }
        let mut spec = json!({
            "kubeConfig": {"location": self.secret_name(), "locationType": "Secret"},
        });
        if !self.labels.is_empty() {
            spec["labels"] = json!(self.labels);
        }
        if let Some(s) = &self.scheduler_name {
            spec["schedulerName"] = json!(s);
        }
        if let Some(q) = &self.kueue_local_queue {
            spec["kueue"] = json!({"localQueueName": q});
        }
        let typed: WorkerClusterSpec = serde_json::from_value(spec.clone())
            .map_err(|e| format!("the WorkerCluster spec made does not read back: {e}"))?;
        validate_worker_cluster(&self.name, &typed).map_err(|errors| errors.join("; "))?;
        Ok(json!({
            "apiVersion": "switchyard.dev/v1alpha1",
            "kind": "WorkerCluster",
            "metadata": {"name": self.name},
            "spec": spec,
        }))
    }
}

/// Everything the manifests are made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    pub worker: Worker,
    /// Switchyard's namespace in the manager, where the kubeconfig Secret goes.
    pub namespace: String,
    /// The worker's API server as the manager's pods reach it.
    pub server: String,
    /// PEM certificates the manager trusts for that server.
    pub ca_pem: String,
    /// The dispatcher's ServiceAccount token in the worker.
    pub token: String,
}

impl Registration {
    /// The kubeconfig the manager uses for this worker (YAML).
    pub fn kubeconfig(&self) -> String {
        let ca = base64::engine::general_purpose::STANDARD.encode(&self.ca_pem);
        let doc = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": self.worker.name, "cluster": {
                "server": self.server,
                "certificate-authority-data": ca,
            }}],
            "users": [{"name": "switchyard-dispatcher", "user": {"token": self.token}}],
            "contexts": [{"name": self.worker.name, "context": {
                "cluster": self.worker.name,
                "user": "switchyard-dispatcher",
            }}],
            "current-context": self.worker.name,
        });
        serde_yaml::to_string(&doc).expect("a kubeconfig of strings serializes")
    }

    /// The Secret and the WorkerCluster to apply to the manager, as one YAML stream; an error
    /// names what the manager would refuse (the name, a label, an insecure kubeconfig).
    pub fn manifests(&self) -> Result<String, String> {
        let worker_cluster = self.worker.object()?;
        if self.token.is_empty() {
            return Err("no token for the dispatcher: the manager could not authenticate".into());
        }
        let kubeconfig = self.kubeconfig();
        let parsed = Kubeconfig::from_yaml(&kubeconfig)
            .map_err(|e| format!("the kubeconfig made does not parse: {e}"))?;
        check(&parsed).map_err(|e| format!("the manager would refuse the kubeconfig: {e}"))?;
        let secret = json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": self.worker.secret_name(),
                "namespace": self.namespace,
            },
            "type": "Opaque",
            "stringData": {"kubeconfig": kubeconfig},
        });
        let yaml = |v: &Value| serde_yaml::to_string(v).expect("JSON values serialize as YAML");
        Ok(format!(
            "# The kubeconfig the manager uses for worker {name:?}, made by `switchyard register-worker`.\n\
             {secret}---\n{worker}",
            name = self.worker.name,
            secret = yaml(&secret),
            worker = yaml(&worker_cluster)
        ))
    }
}

/// What `register-worker` reads from where.
#[derive(Debug, Clone)]
pub struct Source {
    pub worker: Worker,
    /// The worker's kubeconfig (`None`: `$KUBECONFIG`, else `~/.kube/config`).
    pub kubeconfig: Option<PathBuf>,
    /// Its context (`None`: the current one).
    pub context: Option<String>,
    /// The server the manager reaches (`None`: the context's).
    pub server: Option<String>,
    /// Switchyard's namespace in the worker, where the token Secret is.
    pub namespace: String,
    /// Switchyard's namespace in the manager, where the kubeconfig Secret goes.
    pub manager_namespace: String,
    pub token_secret: String,
    /// How long to wait for the token controller to fill a new Secret.
    pub wait: Duration,
    /// How long one request to the worker may take, credential plugins included (kube runs
    /// an `exec` plugin as it builds the client, and waits for it without a limit of its own).
    pub request_timeout: Duration,
}

impl Source {
    /// What the worker or the manager would refuse in the names given, before any request.
    fn check(&self) -> Result<(), String> {
        self.worker.object()?;
        for (flag, namespace) in [
            ("--namespace", &self.namespace),
            ("--manager-namespace", &self.manager_namespace),
        ] {
            if !crate::api::is_dns1123_label(namespace) {
                return Err(format!(
                    "{flag} {namespace:?} is not a namespace name: lowercase letters, digits and '-', starting and ending with a letter or digit"
                ));
            }
        }
        if !crate::api::names::is_dns1123_subdomain(&self.token_secret) {
            return Err(format!(
                "--token-secret {:?} is not a Secret name: lowercase letters, digits, '-' and '.'",
                self.token_secret
            ));
        }
        Ok(())
    }
}

/// Reads the token Secret from the worker, makes the registration, and returns its manifests
/// once its kubeconfig has worked there. What the manager would refuse is said before anything
/// is read, and before the kubeconfig is tried. Warnings (a loopback server, a check that could
/// not be made from here) go to `warn`.
pub async fn manifests(source: &Source, warn: &mut dyn FnMut(String)) -> anyhow::Result<String> {
    source.check().map_err(anyhow::Error::msg)?;
    let Connection {
        client,
        server: context_server,
        ca: context_ca,
    } = connect(source).await?;
    let data = token_secret(&client, source)
        .await?
        .data
        .unwrap_or_default();
    let text = |key: &str| {
        data.get(key)
            .map(|v| String::from_utf8_lossy(&v.0).into_owned())
    };
    let token = text("token").unwrap_or_default().trim().to_string();
    let ca_pem = ca_bundle([text("ca.crt"), context_ca]);
    if ca_pem.is_empty() {
        bail!(
            "no CA for the worker's API server: Secret {}/{} has no ca.crt and the kubeconfig's context has no certificate-authority-data",
            source.namespace,
            source.token_secret
        );
    }
    let server = source.server.clone().unwrap_or(context_server.clone());
    if is_loopback(&server) {
        warn(format!(
            "the server {server} is a loopback address: the manager's pods reach it only if they run on this machine; give --server with the address they reach the worker's API at"
        ));
    }
    let registration = Registration {
        worker: source.worker.clone(),
        namespace: source.manager_namespace.clone(),
        server: server.clone(),
        ca_pem,
        token,
    };
    let manifests = registration.manifests().map_err(anyhow::Error::msg)?;
    match try_kubeconfig(&registration).await {
        Ok(()) => {}
        // Another address than the one this machine used may only answer the manager.
        Err(e) if server != context_server => warn(format!(
            "could not check the kubeconfig against {server} from here ({e}); check that the WorkerCluster becomes Active"
        )),
        Err(e) => return Err(e),
    }
    Ok(manifests)
}

/// This machine's client for the worker, from the user's kubeconfig and context, with the
/// server and CA that context names.
struct Connection {
    client: kube::Client,
    /// Without a trailing `/`.
    server: String,
    /// PEM, when the kubeconfig embeds it.
    ca: Option<String>,
}

async fn connect(source: &Source) -> anyhow::Result<Connection> {
    let kubeconfig = match &source.kubeconfig {
        Some(path) => Kubeconfig::read_from(path)
            .with_context(|| format!("cannot read the worker's kubeconfig {}", path.display()))?,
        None => Kubeconfig::read().context(
            "cannot read the worker's kubeconfig ($KUBECONFIG, else ~/.kube/config; or give --kubeconfig)",
        )?,
    };
    let options = KubeConfigOptions {
        context: source.context.clone(),
        ..Default::default()
    };
    let ca = context_ca_pem(&kubeconfig, source.context.as_deref());
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &options)
        .await
        .context("cannot use the worker's kubeconfig")?;
    let server = config.cluster_url.to_string();
    let server = server.trim_end_matches('/').to_string();
    config.connect_timeout = Some(Duration::from_secs(10));
    config.read_timeout = Some(Duration::from_secs(30));
    // Building the client runs an `exec` credential plugin, synchronously: on a thread of its
    // own, so that one that never returns is given up on.
    let build = tokio::task::spawn_blocking(move || kube::Client::try_from(config));
    let timeout = source.request_timeout;
    let client = match tokio::time::timeout(timeout, build).await {
        Ok(Ok(built)) => built.context("cannot build a client for the worker")?,
        Ok(Err(e)) => bail!("cannot build a client for the worker: {e}"),
        Err(_) => bail!(
            "cannot build a client for the worker: its kubeconfig's credential plugin did not return within {timeout:?}"
        ),
    };
    Ok(Connection { client, server, ca })
}

/// The token Secret, once the token controller has filled it (it does so right after the
/// chart creates it, so a fresh install may be a moment ahead of it).
async fn token_secret(client: &kube::Client, source: &Source) -> anyhow::Result<Secret> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &source.namespace);
    let what = format!("Secret {}/{}", source.namespace, source.token_secret);
    let deadline = Instant::now() + source.wait;
    loop {
        let read = secrets.get_opt(&source.token_secret);
        let secret = tokio::time::timeout(source.request_timeout, read)
            .await
            .map_err(|_| {
                anyhow!(
                    "cannot read {what} in the worker: no answer within {:?} (is the server reachable, and does the kubeconfig's credential plugin return?)",
                    source.request_timeout
                )
            })?
            .map_err(|e| anyhow!("cannot read {what} in the worker: {}", api_text(&e)))?
            .ok_or_else(|| {
                anyhow!(
                    "the worker has no {what}: install the chart there with --set role=worker (it makes the Secret unless workerAccess.createTokenSecret is false), or name the Secret with --token-secret"
                )
            })?;
        let filled = secret
            .data
            .as_ref()
            .and_then(|d| d.get("token"))
            .is_some_and(|t| !t.0.is_empty());
        if filled {
            return Ok(secret);
        }
        if Instant::now() >= deadline {
            bail!(
                "{what} has no token after {:?}: is it of type kubernetes.io/service-account-token, annotated with the ServiceAccount's name, and is the worker's kube-controller-manager running?",
                source.wait
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The CAs the manager trusts for the worker, each once: the Secret's `ca.crt` is the
/// cluster's root CA, as the worker's pods get it; the context's is the one this command
/// reached the worker with. Both are kept, since the manager may reach the worker by another
/// address than this machine did.
fn ca_bundle(pems: impl IntoIterator<Item = Option<String>>) -> String {
    let mut bundle = String::new();
    for pem in pems.into_iter().flatten() {
        let pem = pem.trim();
        if !pem.is_empty() && !bundle.contains(pem) {
            bundle.push_str(pem);
            bundle.push('\n');
        }
    }
    bundle
}

/// Reaches the worker with the registration's kubeconfig as the manager will: the same checks
/// and client, then one request its token must be allowed (listing Jobs).
async fn try_kubeconfig(r: &Registration) -> anyhow::Result<()> {
    let client = client_for(&r.kubeconfig(), &ClientOptions::default())
        .await
        .map_err(|e| anyhow!("the kubeconfig made is not usable: {e}"))?;
    let jobs: Api<Job> = Api::all(client);
    let one = ListParams::default().limit(1);
    let attempt = jobs.list_metadata(&one);
    match tokio::time::timeout(Duration::from_secs(15), attempt).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(anyhow!(
            "the dispatcher's token cannot list Jobs in the worker: {}",
            api_text(&e)
        )),
        Err(_) => Err(anyhow!("the worker did not answer within 15s")),
    }
}

/// A client error as one line: an API server's refusal by its code, reason and message (kube's
/// own text adds the whole Status); any other error with its causes (a connection refused is
/// only in the cause of kube's "client error (Connect)").
fn api_text(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} {}: {}", s.code, s.reason, s.message),
        other => {
            let mut line = other.to_string();
            let mut cause = std::error::Error::source(other);
            while let Some(c) = cause {
                let text = c.to_string();
                if !line.contains(&text) {
                    line.push_str(": ");
                    line.push_str(&text);
                }
                cause = c.source();
            }
            line
        }
    }
}

/// The CA data of the cluster the chosen context names, as PEM, when the kubeconfig embeds it.
fn context_ca_pem(k: &Kubeconfig, context: Option<&str>) -> Option<String> {
    let name = context.or(k.current_context.as_deref())?;
    let cluster = &k
        .contexts
        .iter()
        .find(|c| c.name == name)?
        .context
        .as_ref()?
        .cluster;
    let data = k
        .clusters
        .iter()
        .find(|c| c.name == *cluster)?
        .cluster
        .as_ref()?
        .certificate_authority_data
        .as_ref()?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .ok()?;
    String::from_utf8(bytes).ok()
}

/// Whether a server URL names this machine.
fn is_loopback(server: &str) -> bool {
    let host = server
        .split_once("://")
        .map_or(server, |(_, rest)| rest)
        .split('/')
        .next()
        .unwrap_or("");
    let host = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registration() -> Registration {
        Registration {
            worker: Worker {
                name: "gpu-1".into(),
                scheduler_name: Some("switchyard-scheduler".into()),
                labels: BTreeMap::from([("tier".into(), "gold".into())]),
                kueue_local_queue: None,
            },
            namespace: crate::config::DEFAULT_NAMESPACE.into(),
            server: "https://gpu-1.example:6443".into(),
            ca_pem: "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".into(),
            token: "eyJhbGciOi.token".into(),
        }
    }

    fn documents(yaml: &str) -> Vec<Value> {
        serde_yaml::Deserializer::from_str(yaml)
            .map(|d| serde::Deserialize::deserialize(d).unwrap())
            .collect()
    }

    #[test]
    fn the_manifests_are_a_secret_and_a_worker_cluster_pointing_to_it() {
        let docs = documents(&registration().manifests().unwrap());
        assert_eq!(docs.len(), 2);
        let (secret, worker) = (&docs[0], &docs[1]);
        assert_eq!(secret["kind"], "Secret");
        assert_eq!(secret["metadata"]["name"], "gpu-1-kubeconfig");
        assert_eq!(secret["metadata"]["namespace"], "switchyard-system");
        assert_eq!(worker["kind"], "WorkerCluster");
        assert_eq!(worker["metadata"]["name"], "gpu-1");
        assert_eq!(
            worker["spec"],
            json!({
                "kubeConfig": {"location": "gpu-1-kubeconfig", "locationType": "Secret"},
                "labels": {"tier": "gold"},
                "schedulerName": "switchyard-scheduler",
            })
        );
        // The kubeconfig in the Secret is one the manager accepts, with the token and CA.
        let text = secret["stringData"]["kubeconfig"].as_str().unwrap();
        let parsed = Kubeconfig::from_yaml(text).unwrap();
        check(&parsed).unwrap();
        let cluster = parsed.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(
            cluster.server.as_deref(),
            Some("https://gpu-1.example:6443")
        );
        let ca = base64::engine::general_purpose::STANDARD
            .decode(cluster.certificate_authority_data.as_ref().unwrap())
            .unwrap();
        assert_eq!(String::from_utf8(ca).unwrap(), registration().ca_pem);
        let plain: Value = serde_yaml::from_str(text).unwrap();
        assert_eq!(plain["users"][0]["user"]["token"], "eyJhbGciOi.token");
    }

    #[test]
    fn what_the_manager_would_refuse_is_refused_here() {
        let mut r = registration();
        r.server = "http://gpu-1.example:8080".into();
        assert!(r.manifests().unwrap_err().contains("not https"));
        let mut r = registration();
        r.worker.name = "GPU_1".into();
        assert!(r
            .manifests()
            .unwrap_err()
            .contains("not a WorkerCluster name"));
        let mut r = registration();
        r.worker.labels = BTreeMap::from([("bad key!".into(), "x".into())]);
        assert!(r.manifests().unwrap_err().contains("spec.labels"));
        let mut r = registration();
        r.token = String::new();
        assert!(r.manifests().unwrap_err().contains("no token"));
    }

    #[test]
    fn the_ca_bundle_holds_each_certificate_once() {
        let a = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----";
        let b = "-----BEGIN CERTIFICATE-----\nBBBB\n-----END CERTIFICATE-----\n";
        assert_eq!(
            ca_bundle([Some(a.into()), Some(format!("{a}\n"))]),
            format!("{a}\n")
        );
        assert_eq!(
            ca_bundle([Some(a.into()), None, Some(b.into())]),
            format!("{a}\n{b}")
        );
        assert_eq!(ca_bundle([None, Some("  ".into())]), "");
    }

    #[test]
    fn loopback_servers_are_told_apart() {
        for s in [
            "https://127.0.0.1:6443",
            "https://localhost:6443",
            "https://[::1]:6443",
            "https://127.0.0.2",
        ] {
            assert!(is_loopback(s), "{s}");
        }
        for s in [
            "https://10.0.0.7:6443",
            "https://worker.example",
            "https://[fd00::1]:6443",
        ] {
            assert!(!is_loopback(s), "{s}");
        }
    }
}
