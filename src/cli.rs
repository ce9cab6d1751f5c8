//! Command-line interface. Every `serve` flag can also come from the YAML file given with
//! `--config` (flags win) and the common ones from `SWITCHYARD_*` environment variables.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(
    name = "switchyard",
    version,
    about = "Multi-cluster batch dispatcher for Kubernetes"
)]
pub struct Cli {
    /// Log format.
    #[arg(long, global = true, env = "SWITCHYARD_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,
    /// Log filter in RUST_LOG syntax (e.g. `info,switchyard=debug`); RUST_LOG is read too.
    #[arg(long = "log", global = true, env = "SWITCHYARD_LOG")]
    pub log_filter: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// What a `serve` process is in the fleet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Runs in a manager cluster: the WorkerCluster controller, leader election, virtual
    /// nodes, and the extender over every worker's live inventory.
    Manager,
    /// The extender over the live inventory of the cluster it runs in.
    #[default]
    Worker,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the admission webhooks (HTTPS) and the probes and metrics (HTTP).
    Serve(Box<ServeArgs>),
    /// Write a development CA and a serving certificate: ca.crt, tls.crt, tls.key.
    Certs(CertsArgs),
    /// Kubelet Topology Manager emulation.
    #[command(subcommand)]
    Topology(TopologyCommand),
    /// Why a pod fits or not on each node or cluster of an inventory.
    Explain(ExplainArgs),
    /// Print the CustomResourceDefinitions (YAML).
    Crds,
    /// Run the dispatcher against simulated worker clusters in virtual time.
    Simulate(SimulateArgs),
    /// Print the kubeconfig Secret and the WorkerCluster that register a worker with the
    /// manager, made from the dispatcher's token Secret the worker's chart created. Run it with
    /// the worker's kubeconfig; apply its output to the manager (`| kubectl apply -f -`).
    RegisterWorker(RegisterWorkerArgs),
}

#[derive(Debug, Args)]
pub struct RegisterWorkerArgs {
    /// The WorkerCluster's name (the kubeconfig Secret is NAME-kubeconfig).
    pub name: String,
    /// The worker's kubeconfig [default: $KUBECONFIG, else ~/.kube/config].
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The worker's context in it [default: its current context].
    #[arg(long)]
    pub context: Option<String>,
    /// The worker's API server as the manager's pods reach it [default: the context's server].
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,
    /// Switchyard's namespace in the worker (where its token Secret is), and in the manager
    /// unless --manager-namespace says otherwise.
    #[arg(long, default_value = crate::config::DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// Switchyard's namespace in the manager, where the kubeconfig Secret goes [default: the
    /// --namespace].
    #[arg(long, value_name = "NAMESPACE")]
    pub manager_namespace: Option<String>,
    /// The worker's Secret holding the dispatcher's ServiceAccount token.
    #[arg(long, default_value = crate::register::DEFAULT_TOKEN_SECRET)]
    pub token_secret: String,
    /// spec.schedulerName: the worker's second scheduler, when its chart enabled one
    /// (`switchyard-scheduler`).
    #[arg(long, value_name = "NAME")]
    pub scheduler_name: Option<String>,
    /// spec.kueue.localQueueName: the worker runs Kueue, and copies enter this LocalQueue.
    #[arg(long, value_name = "NAME")]
    pub kueue_local_queue: Option<String>,
    /// spec.labels entry (repeatable).
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = key_value)]
    pub labels: Vec<(String, String)>,
    /// Seconds to wait for the worker's token controller to fill a new token Secret.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    pub wait: u64,
    /// Seconds one request to the worker may take, its kubeconfig's credential plugin included.
    #[arg(long, default_value_t = 30, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
    pub request_timeout: u64,
}

fn key_value(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{s:?} is not KEY=VALUE"))
}

#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// Scenario file (clusters, queues, Jobs) [default: the bundled examples/scenario.yaml].
    #[arg(long)]
    pub scenario: Option<PathBuf>,
    /// How workers are chosen: switchyard (exact NUMA-aware fit of the whole gang),
    /// all-at-once (a copy to every worker, the first to start keeps it), sum-aggregate (by
    /// the sum of a worker's free resources), or all (the three on the same scenario, side by
    /// side).
    #[arg(long, value_enum, default_value = "switchyard")]
    pub strategy: SimStrategy,
    /// Output format (with `--strategy all`: one table of the three summaries, or a JSON
    /// array of the three reports).
    #[arg(long, value_enum, default_value = "text")]
    pub output: SimOutput,
    /// Also print every decision as it is carried out, with its virtual time (to stderr).
    #[arg(long)]
    pub events: bool,
    /// Also write the report as one self-contained HTML page (charts of capacity in use, Jobs
    /// waiting and start waits, the summaries side by side, the Jobs that did not succeed);
    /// best with `--strategy all`.
    #[arg(long, value_name = "FILE.html")]
    pub report: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SimStrategy {
    Switchyard,
    AllAtOnce,
    SumAggregate,
    All,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SimOutput {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum TopologyCommand {
    /// Read a JSON array of merge cases on stdin, write the array of results on stdout
    /// (the format of the conformance vectors).
    Merge,
}

#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// Inventory file.
    #[arg(long)]
    pub inventory: PathBuf,
    /// Pod manifest (YAML or JSON); or a batch/v1 Job or a JobSet, judged as its pod
    /// template and the gang of all the pods the dispatcher places at once.
    #[arg(long)]
    pub pod: PathBuf,
    /// Only this node.
    #[arg(long, conflicts_with = "cluster")]
    pub node: Option<String>,
    /// Only this cluster (judged for the pod's gang size).
    #[arg(long)]
    pub cluster: Option<String>,
    /// What to do with nodes without NUMA data.
    #[arg(long, value_enum, default_value = "allow")]
    pub numa_unknown: NumaUnknownArg,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum NumaUnknownArg {
    Allow,
    Deny,
}

#[derive(Debug, Args, Default)]
pub struct ServeArgs {
    /// YAML configuration file (keys as in docs/configuration.md).
    #[arg(long, env = "SWITCHYARD_CONFIG")]
    pub config: Option<PathBuf>,
    /// HTTPS address for the webhooks [default: 0.0.0.0:9443].
    #[arg(long, env = "SWITCHYARD_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Plain-HTTP address for /healthz, /readyz and /metrics [default: 0.0.0.0:8080].
    #[arg(long, env = "SWITCHYARD_PROBE_LISTEN")]
    pub probe_listen: Option<SocketAddr>,
    /// Serving certificate chain (PEM); re-read periodically, so renewals need no restart.
    #[arg(long, env = "SWITCHYARD_TLS_CERT", requires = "tls_key")]
    pub(crate) tls_cert: Option<PathBuf>,
    /// Serving private key (PEM).
    #[arg(long, env = "SWITCHYARD_TLS_KEY", requires = "tls_cert")]
    pub(crate) tls_key: Option<PathBuf>,
    /// Create (or reuse) a development CA and a certificate for localhost and 127.0.0.1 in DIR.
    #[arg(long, env = "SWITCHYARD_DEV_TLS", value_name = "DIR", conflicts_with_all = ["tls_cert", "tls_key"])]
    pub(crate) dev_tls: Option<PathBuf>,
    /// Require client certificates signed by this CA (PEM).
    #[arg(long, env = "SWITCHYARD_CLIENT_CA")]
    pub(crate) client_ca: Option<PathBuf>,
    /// Never contact a Kubernetes API server; surfaces that need one are off.
    #[arg(long, env = "SWITCHYARD_STANDALONE")]
    pub(crate) standalone: bool,
    /// Queue given to unlabelled Jobs in namespaces matching `managedNamespaces` (config file).
    #[arg(long, env = "SWITCHYARD_DEFAULT_QUEUE")]
    pub(crate) default_queue: Option<String>,
    /// User allowed to unsuspend Jobs (repeatable) [default: system:serviceaccount:switchyard-system:switchyard].
    #[arg(long = "dispatcher-username", value_name = "USER")]
    pub dispatcher_usernames: Vec<String>,
    /// HTTPS worker threads [default: number of CPUs].
    #[arg(long)]
    pub(crate) workers: Option<usize>,
    /// How long in-flight requests may take to finish after SIGTERM (e.g. 25s) [default: 25s].
    #[arg(long)]
    pub(crate) shutdown_timeout: Option<String>,
    /// How often the certificate files are re-read (e.g. 10s) [default: 10s].
    #[arg(long)]
    pub(crate) tls_reload_interval: Option<String>,
    /// Inventory file (clusters, nodes, NUMA zones) the scheduler extender judges nodes against.
    #[arg(long, env = "SWITCHYARD_INVENTORY")]
    pub(crate) inventory: Option<PathBuf>,
    /// manager: WorkerClusters, leader election, virtual nodes; worker: the extender over the
    /// local cluster [default: worker].
    #[arg(long, env = "SWITCHYARD_ROLE", value_enum)]
    pub role: Option<Role>,
    /// Switchyard's namespace (kubeconfig Secrets, the leader Lease) [default: POD_NAMESPACE,
    /// else the service account's namespace, else switchyard-system].
    #[arg(long, env = "SWITCHYARD_NAMESPACE")]
    pub(crate) namespace: Option<String>,
    /// Do not keep one virtual node per worker cluster in the manager cluster.
    #[arg(long)]
    pub(crate) no_virtual_nodes: bool,
    /// This manager's name on the worker copies it creates (label `switchyard.dev/origin`)
    /// [default: switchyard].
    #[arg(long, env = "SWITCHYARD_MANAGER_ID")]
    pub(crate) manager_id: Option<String>,
}

#[derive(Debug, Args)]
pub struct CertsArgs {
    /// Directory to write ca.crt, tls.crt and tls.key into (created if missing).
    #[arg(long)]
    pub out: PathBuf,
    /// DNS name for the serving certificate (repeatable) [default: localhost].
    #[arg(long = "dns", value_name = "NAME")]
    pub dns: Vec<String>,
    /// IP address for the serving certificate (repeatable) [default: 127.0.0.1].
    #[arg(long = "ip", value_name = "IP")]
    pub ip: Vec<IpAddr>,
}
