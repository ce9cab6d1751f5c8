//! `serve` configuration: the YAML file, merged under the command-line flags, resolved into
//! [`ServeSettings`] with every default applied.

use crate::api::is_dns1123_label;
use crate::cli::{LogFormat, Role, ServeArgs};
use crate::selector;
use crate::webhook::AdmissionPolicy;
use crate::wellknown::DEFAULT_DISPATCHER_USERNAME;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
}

/// The YAML configuration file. Unknown keys are errors: a misspelt key silently ignored
/// would leave a setting at its default without anyone noticing.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[serde(expecting = "a configuration: a map of settings")]
pub struct FileConfig {
    pub listen: Option<SocketAddr>,
    pub probe_listen: Option<SocketAddr>,
    pub(crate) tls_cert: Option<PathBuf>,
    pub(crate) tls_key: Option<PathBuf>,
    pub(crate) dev_tls: Option<PathBuf>,
    pub(crate) client_ca: Option<PathBuf>,
    pub(crate) standalone: Option<bool>,
    pub log_format: Option<LogFormat>,
    pub log: Option<String>,
    pub(crate) default_queue: Option<String>,
    pub(crate) managed_namespaces: Option<LabelSelector>,
    pub dispatcher_usernames: Option<Vec<String>>,
    pub(crate) workers: Option<usize>,
    pub(crate) shutdown_timeout: Option<String>,
    pub(crate) tls_reload_interval: Option<String>,
    pub(crate) max_review_bytes: Option<usize>,
    pub(crate) max_connections: Option<usize>,
    pub(crate) namespace_cache_ttl: Option<String>,
    pub(crate) inventory: Option<PathBuf>,
    pub(crate) virtual_node_prefix: Option<String>,
    pub(crate) numa_unknown: Option<crate::placement::NumaUnknown>,
    pub(crate) placement_strategy: Option<crate::placement::Strategy>,
    pub(crate) inflight_ttl: Option<String>,
    pub(crate) stale_after: Option<String>,
    pub role: Option<Role>,
    pub(crate) namespace: Option<String>,
    pub(crate) leader_election: Option<LeaderElectionFile>,
    pub(crate) virtual_nodes: Option<bool>,
    pub(crate) worker_qps: Option<f64>,
    pub(crate) worker_burst: Option<u32>,
    pub(crate) manager_id: Option<String>,
    /// Whether JobSets are dispatched: `auto` (when the manager serves the JobSet API at
    /// start-up), `true` or `false`. The chart sets it as it decided its RBAC and webhooks.
    pub(crate) jobsets: Option<crate::dispatcher::live::JobSets>,
}

/// `leaderElection` in the configuration file.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[serde(expecting = "leaderElection settings: a map")]
pub(crate) struct LeaderElectionFile {
    pub(crate) enabled: Option<bool>,
    pub(crate) lease_name: Option<String>,
    pub(crate) lease_duration: Option<String>,
    pub(crate) renew_deadline: Option<String>,
    pub(crate) retry_period: Option<String>,
}

/// Leader election among manager replicas, defaults applied.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LeaderElectionSettings {
    pub(crate) enabled: bool,
    pub(crate) lease_name: String,
    pub(crate) lease_duration: Duration,
    pub(crate) renew_deadline: Duration,
    pub(crate) retry_period: Duration,
}

impl Default for LeaderElectionSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            lease_name: "switchyard-leader".into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// Where the service account's namespace is mounted in a pod.
pub(crate) const SERVICE_ACCOUNT_NAMESPACE_FILE: &str =
    "/var/run/secrets/kubernetes.io/serviceaccount/namespace";
pub const DEFAULT_NAMESPACE: &str = "switchyard-system";
pub(crate) const DEFAULT_MANAGER_ID: &str = "switchyard";

/// Switchyard's namespace: the flag (or `SWITCHYARD_NAMESPACE`), the file, `POD_NAMESPACE`,
/// the service account's namespace, else `switchyard-system`. Empty values are skipped.
pub(crate) fn resolve_namespace(
    flag: Option<&str>,
    file: Option<&str>,
    pod_namespace: Option<&str>,
    service_account: Option<&str>,
) -> Result<String, ConfigError> {
    let chosen = [flag, file, pod_namespace, service_account]
        .into_iter()
        .flatten()
        .map(str::trim)
        .find(|s| !s.is_empty())
        .unwrap_or(DEFAULT_NAMESPACE);
    if !is_dns1123_label(chosen) {
        return Err(ConfigError::Invalid {
            field: "namespace",
            message: format!("{chosen:?} is not a namespace name (a DNS-1123 label)"),
        });
    }
    Ok(chosen.to_string())
}

impl FileConfig {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.into(),
            source,
        })?;
        Self::parse(&text).map_err(|message| ConfigError::Parse {
            path: path.into(),
            message,
        })
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        let text = crate::text::without_bom(text);
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        let (config, skipped) = crate::unread::from_yaml(text).map_err(|e| e.to_string())?;
        // Every key of the file is Switchyard's: the `managedNamespaces` selector too, where a
        // misspelt `matchLabel` would leave a selector that takes every namespace.
        let judged = crate::unread::judge(&skipped, |_| crate::unread::Owner::Switchyard);
        match judged.errors.is_empty() {
            true => Ok(config),
            false => Err(judged.errors.join("; ")),
        }
    }
}

/// Where the serving certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsSource {
    Files {
        cert: PathBuf,
        key: PathBuf,
    },
    /// A development CA and certificate, created in (or reused from) this directory.
    Dev(PathBuf),
}

/// Everything `serve` needs, defaults applied.
#[derive(Debug, Clone)]
pub struct ServeSettings {
    pub listen: SocketAddr,
    pub probe_listen: SocketAddr,
    pub tls: TlsSource,
    pub client_ca: Option<PathBuf>,
    pub standalone: bool,
    pub policy: AdmissionPolicy,
    pub workers: usize,
    pub shutdown_timeout: Duration,
    pub tls_reload_interval: Duration,
    /// The largest AdmissionReview body accepted.
    pub max_review_bytes: usize,
    /// The most HTTPS connections held at once, across the workers; more wait in the backlog.
    pub max_connections: usize,
    pub(crate) namespace_cache_ttl: Duration,
    /// How long a request body may take to arrive before the request is refused.
    pub body_timeout: Duration,
    /// The inventory file the extender judges nodes against.
    pub inventory: Option<PathBuf>,
    pub(crate) extender: crate::extender::ExtenderConfig,
    /// A live inventory silent for this long makes its cluster unschedulable.
    pub(crate) stale_after: Duration,
    pub role: Role,
    /// Switchyard's namespace: kubeconfig Secrets and the leader Lease live there.
    pub(crate) namespace: String,
    pub(crate) leader_election: LeaderElectionSettings,
    /// Keep one virtual node per worker cluster (manager only).
    pub(crate) virtual_nodes: bool,
    /// Per-worker client rate limit: requests per second and burst.
    pub(crate) worker_qps: f64,
    pub(crate) worker_burst: u32,
    /// Names this manager on the worker copies it creates (`switchyard.dev/origin`), so two
    /// managers sharing a worker never touch each other's copies.
    pub(crate) manager_id: String,
    /// Whether the dispatcher runs JobSets too.
    pub(crate) jobsets: crate::dispatcher::live::JobSets,
}

/// The ports `serve` listens on unless `listen` and `probeListen` say otherwise.
pub const DEFAULT_HTTPS_PORT: u16 = 9443;
pub const DEFAULT_PROBE_PORT: u16 = 8080;

/// The API server refuses request bodies over 3 MiB, and an UPDATE review carries the object
/// twice (`object` and `oldObject`) plus the envelope: 7 MiB leaves room for both.
pub(crate) const DEFAULT_MAX_REVIEW_BYTES: usize = 7 * 1024 * 1024;

/// Each HTTPS connection holds a descriptor, so without a bound below the process's open
/// files limit a flood of connections would leave none for the probes, the Kubernetes client
/// or a certificate reload. The callers are a few kube-apiserver and kube-scheduler replicas,
/// each keeping tens of connections alive: 4,096 is far above that. The container runtime's
/// open files limit (usually 1,048,576) is far above it too. Memory: in the connection abuse
/// campaign (tests/abuse.rs) 2,200 connections, both ends in one process, took about 230 MiB,
/// and a connection whose client reads nothing also holds up to 256 KiB of kernel send buffer.
pub(crate) const DEFAULT_MAX_CONNECTIONS: usize = 4096;

impl ServeSettings {
    /// Settings for tests and benchmarks: loopback, ephemeral ports, the given certificate.
    pub fn for_tests(tls: TlsSource) -> Self {
        Self {
            listen: ([127, 0, 0, 1], 0).into(),
            probe_listen: ([127, 0, 0, 1], 0).into(),
            tls,
            client_ca: None,
            standalone: true,
            policy: AdmissionPolicy::default(),
            workers: 2,
            shutdown_timeout: Duration::from_secs(5),
            tls_reload_interval: Duration::from_secs(10),
            max_review_bytes: DEFAULT_MAX_REVIEW_BYTES,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            namespace_cache_ttl: Duration::from_secs(30),
            body_timeout: Duration::from_secs(10),
            inventory: None,
            extender: Default::default(),
            stale_after: Duration::from_secs(120),
            role: Role::Worker,
            namespace: DEFAULT_NAMESPACE.into(),
            leader_election: LeaderElectionSettings::default(),
            virtual_nodes: true,
            worker_qps: 100.0,
            worker_burst: 200,
            manager_id: DEFAULT_MANAGER_ID.into(),
            jobsets: Default::default(),
        }
    }

    /// Flags over file over defaults, each setting checked: the first one found wrong is the
    /// error. Every key of the file is named here, so a key added to [`FileConfig`] and not
    /// read is a compile error.
    pub fn resolve(args: &ServeArgs, file: FileConfig) -> Result<Self, ConfigError> {
        let FileConfig {
            listen,
            probe_listen,
            tls_cert,
            tls_key,
            dev_tls,
            client_ca,
            standalone,
            // Read by `main` before logging starts.
            log_format: _,
            log: _,
            default_queue,
            managed_namespaces,
            dispatcher_usernames,
            workers,
            shutdown_timeout,
            tls_reload_interval,
            max_review_bytes,
            max_connections,
            namespace_cache_ttl,
            inventory,
            virtual_node_prefix,
            numa_unknown,
            placement_strategy,
            inflight_ttl,
            stale_after,
            role,
            namespace,
            leader_election: election,
            virtual_nodes,
            worker_qps,
            worker_burst,
            manager_id,
            jobsets,
        } = file;
        let tls = serving_certificate(args, tls_cert, tls_key, dev_tls)?;
        let policy = admission_policy(
            args,
            default_queue,
            managed_namespaces,
            dispatcher_usernames,
        )?;
        let tls_reload_interval =
            certificate_reload_interval(args.tls_reload_interval.clone().or(tls_reload_interval))?;
        let workers = worker_threads(args.workers.or(workers))?;
        let role = args.role.or(role).unwrap_or_default();
        let inventory = inventory_file(role, args.inventory.clone().or(inventory))?;
        let namespace = resolve_namespace(
            args.namespace.as_deref(),
            namespace.as_deref(),
            std::env::var("POD_NAMESPACE").ok().as_deref(),
            std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE_FILE)
                .ok()
                .as_deref(),
        )?;
        let leader_election = leader_election(election.unwrap_or_default())?;
        let (worker_qps, worker_burst) = worker_client_rate(worker_qps, worker_burst)?;
        let (max_review_bytes, max_connections) =
            request_limits(max_review_bytes, max_connections, workers)?;
        let manager_id = manager_id_of(args.manager_id.clone().or(manager_id))?;
        let shutdown_timeout = above_zero(
            "shutdownTimeout",
            duration(
                "shutdownTimeout",
                args.shutdown_timeout.clone().or(shutdown_timeout),
                Duration::from_secs(25),
            )?,
            "in-flight requests would be cut off at once on SIGTERM",
        )?;
        let namespace_cache_ttl = above_zero(
            "namespaceCacheTtl",
            duration(
                "namespaceCacheTtl",
                namespace_cache_ttl,
                Duration::from_secs(30),
            )?,
            "every review would wait for the API server",
        )?;
        let stale_after = above_zero(
            "staleAfter",
            duration("staleAfter", stale_after, Duration::from_secs(120))?,
            "every live inventory would be stale at once, and every cluster unschedulable",
        )?;
        let extender = crate::extender::ExtenderConfig {
            engine: crate::placement::EngineConfig {
                numa_unknown: numa_unknown.unwrap_or_default(),
                strategy: placement_strategy.unwrap_or(crate::placement::Strategy::LeastAllocated),
            },
            virtual_node_prefix: virtual_node_prefix.unwrap_or_else(|| "switchyard-".into()),
            inflight_ttl: above_zero(
                "inflightTtl",
                duration("inflightTtl", inflight_ttl, Duration::from_secs(30))?,
                "a pod bound through the extender would be forgotten before its node shows it, and another could be placed in its room",
            )?,
        };
        Ok(Self {
            role,
            namespace,
            manager_id,
            jobsets: jobsets.unwrap_or_default(),
            leader_election,
            virtual_nodes: !args.no_virtual_nodes && virtual_nodes.unwrap_or(true),
            worker_qps,
            worker_burst,
            listen: args
                .listen
                .or(listen)
                .unwrap_or(([0, 0, 0, 0], DEFAULT_HTTPS_PORT).into()),
            probe_listen: args
                .probe_listen
                .or(probe_listen)
                .unwrap_or(([0, 0, 0, 0], DEFAULT_PROBE_PORT).into()),
            tls,
            client_ca: args.client_ca.clone().or(client_ca),
            standalone: args.standalone || standalone.unwrap_or(false),
            policy,
            workers,
            shutdown_timeout,
            tls_reload_interval,
            max_review_bytes,
            max_connections,
            namespace_cache_ttl,
            body_timeout: Duration::from_secs(10),
            inventory,
            stale_after,
            extender,
        })
    }
}

/// A duration setting: `text` (the flag's, else the file's) parsed, or `default`.
fn duration(
    field: &'static str,
    text: Option<String>,
    default: Duration,
) -> Result<Duration, ConfigError> {
    match text {
        None => Ok(default),
        Some(text) => {
            parse_duration(&text).map_err(|message| ConfigError::Invalid { field, message })
        }
    }
}

/// The serving certificate, chosen as a unit: the flags' choice replaces the file's whole,
/// never mixes with it.
fn serving_certificate(
    args: &ServeArgs,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    dev: Option<PathBuf>,
) -> Result<TlsSource, ConfigError> {
    let flags = tls_choice(
        args.tls_cert.clone(),
        args.tls_key.clone(),
        args.dev_tls.clone(),
        ("--tls-cert", "--tls-key", "--dev-tls"),
    )?;
    let from_file = tls_choice(cert, key, dev, ("tlsCert", "tlsKey", "devTls"))?;
    flags.or(from_file).ok_or_else(|| ConfigError::Invalid {
        field: "tls",
        message: "serve needs --tls-cert FILE --tls-key FILE, or --dev-tls DIR for a development certificate (file keys tlsCert/tlsKey or devTls)".into(),
    })
}

/// How often the certificate files are read again: at most a minute, so a renewed
/// certificate is served within one, and at least a second (reading them a thousand times a
/// second took most of a core).
fn certificate_reload_interval(text: Option<String>) -> Result<Duration, ConfigError> {
    let interval = duration("tlsReloadInterval", text, Duration::from_secs(10))?;
    if interval < Duration::from_secs(1) || interval > Duration::from_secs(60) {
        return Err(ConfigError::Invalid {
            field: "tlsReloadInterval",
            message: "must be 1s to 60s, so a renewed certificate is served within a minute without reading the files all the time".into(),
        });
    }
    Ok(interval)
}

/// The HTTPS server's worker threads: one per core unless set.
fn worker_threads(workers: Option<usize>) -> Result<usize, ConfigError> {
    let workers =
        workers.unwrap_or_else(|| std::thread::available_parallelism().map_or(2, usize::from));
    if workers == 0 {
        return Err(ConfigError::Invalid {
            field: "workers",
            message: "must be at least 1".into(),
        });
    }
    Ok(workers)
}

/// The inventory file, which only a worker reads: a manager's inventory comes from its
/// WorkerClusters.
fn inventory_file(role: Role, inventory: Option<PathBuf>) -> Result<Option<PathBuf>, ConfigError> {
    if role == Role::Manager && inventory.is_some() {
        return Err(ConfigError::Invalid {
            field: "inventory",
            message: "a manager's inventory comes from its WorkerClusters: drop --inventory, or use role: worker".into(),
        });
    }
    Ok(inventory)
}

/// The rate of requests to each worker's API server: queries per second and burst.
fn worker_client_rate(qps: Option<f64>, burst: Option<u32>) -> Result<(f64, u32), ConfigError> {
    let qps = qps.unwrap_or(100.0);
    if !(qps.is_finite() && qps > 0.0) {
        return Err(ConfigError::Invalid {
            field: "workerQps",
            message: format!("{qps} must be a number above 0"),
        });
    }
    let burst = burst.unwrap_or(200);
    if burst == 0 {
        return Err(ConfigError::Invalid {
            field: "workerBurst",
            message: "must be at least 1".into(),
        });
    }
    Ok((qps, burst))
}

/// The largest review body, and how many connections are served at once (at least one per
/// worker thread).
fn request_limits(
    max_review_bytes: Option<usize>,
    max_connections: Option<usize>,
    workers: usize,
) -> Result<(usize, usize), ConfigError> {
    let max_review_bytes = max_review_bytes.unwrap_or(DEFAULT_MAX_REVIEW_BYTES);
    if max_review_bytes == 0 {
        return Err(ConfigError::Invalid {
            field: "maxReviewBytes",
            message: format!(
                "must be above 0, or every review is refused as too large (default {DEFAULT_MAX_REVIEW_BYTES})"
            ),
        });
    }
    let max_connections = max_connections.unwrap_or(DEFAULT_MAX_CONNECTIONS);
    if max_connections < workers {
        return Err(ConfigError::Invalid {
            field: "maxConnections",
            message: format!(
                "{max_connections} is below the {workers} workers: each worker needs room for at least one connection (default {DEFAULT_MAX_CONNECTIONS})"
            ),
        });
    }
    Ok((max_review_bytes, max_connections))
}

/// The manager's name on the copies it makes in workers: a label value.
fn manager_id_of(id: Option<String>) -> Result<String, ConfigError> {
    let id = id.unwrap_or_else(|| DEFAULT_MANAGER_ID.into());
    if !crate::api::names::is_label_value(&id) || id.is_empty() {
        return Err(ConfigError::Invalid {
            field: "managerId",
            message: format!(
                "{id:?} must be a label value: 1-63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
            ),
        });
    }
    Ok(id)
}

/// The webhooks' admission policy: flags over file over defaults, each checked.
fn admission_policy(
    args: &ServeArgs,
    default_queue: Option<String>,
    managed_namespaces: Option<LabelSelector>,
    dispatcher_usernames: Option<Vec<String>>,
) -> Result<AdmissionPolicy, ConfigError> {
    let default_queue = args.default_queue.clone().or(default_queue);
    if let Some(q) = &default_queue {
        if !is_dns1123_label(q) {
            return Err(ConfigError::Invalid {
                field: "defaultQueue",
                message: format!(
                    "{q:?} is not a DNS-1123 label (lowercase letters, digits and '-')"
                ),
            });
        }
    }
    if let Some(sel) = &managed_namespaces {
        selector::check(sel).map_err(|message| ConfigError::Invalid {
            field: "managedNamespaces",
            message,
        })?;
    }
    let dispatcher_usernames = if !args.dispatcher_usernames.is_empty() {
        args.dispatcher_usernames.clone()
    } else {
        dispatcher_usernames.unwrap_or_else(|| vec![DEFAULT_DISPATCHER_USERNAME.into()])
    };
    if dispatcher_usernames.is_empty() {
        return Err(ConfigError::Invalid {
            field: "dispatcherUsernames",
            message: "must name at least one user, or no Job could ever start".into(),
        });
    }
    Ok(AdmissionPolicy {
        default_queue,
        managed_namespaces,
        dispatcher_usernames,
    })
}

/// `value` unless it is zero, which `why` explains is never what anyone wants.
fn above_zero(field: &'static str, value: Duration, why: &str) -> Result<Duration, ConfigError> {
    if value.is_zero() {
        return Err(ConfigError::Invalid {
            field,
            message: format!("must be above 0: {why}"),
        });
    }
    Ok(value)
}

/// One source's serving certificate (the flags, or the file): a whole pair, a dev-TLS
/// directory, or nothing. `names` are how that source spells the cert, key and dev-TLS keys.
fn tls_choice(
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    dev: Option<PathBuf>,
    names: (&'static str, &'static str, &'static str),
) -> Result<Option<TlsSource>, ConfigError> {
    let (cert_name, key_name, dev_name) = names;
    match (cert, key, dev) {
        (None, None, None) => Ok(None),
        (Some(cert), Some(key), None) => Ok(Some(TlsSource::Files { cert, key })),
        (None, None, Some(dir)) => Ok(Some(TlsSource::Dev(dir))),
        (_, _, Some(_)) => Err(ConfigError::Invalid {
            field: dev_name,
            message: format!(
                "{cert_name}/{key_name} and {dev_name} are both given: keep the pair for a real certificate, or {dev_name} alone for a development one"
            ),
        }),
        (Some(_), None, None) => Err(ConfigError::Invalid {
            field: key_name,
            message: format!("{cert_name} is given without {key_name}: give both, or neither"),
        }),
        (None, Some(_), None) => Err(ConfigError::Invalid {
            field: cert_name,
            message: format!("{key_name} is given without {cert_name}: give both, or neither"),
        }),
    }
}

/// `leaderElection`, checked as client-go checks it: the lease outlives the renew deadline,
/// which outlives a retry period with its jitter.
fn leader_election(file: LeaderElectionFile) -> Result<LeaderElectionSettings, ConfigError> {
    let d = LeaderElectionSettings::default();
    let duration = |field: &'static str, text: Option<String>, default: Duration| match text {
        None => Ok(default),
        Some(t) => match parse_duration(&t) {
            Ok(v) if !v.is_zero() => Ok(v),
            Ok(_) => Err(ConfigError::Invalid {
                field,
                message: "must be above 0".into(),
            }),
            Err(message) => Err(ConfigError::Invalid { field, message }),
        },
    };
    let s = LeaderElectionSettings {
        enabled: file.enabled.unwrap_or(d.enabled),
        lease_name: file.lease_name.unwrap_or(d.lease_name),
        lease_duration: duration(
            "leaderElection.leaseDuration",
            file.lease_duration,
            d.lease_duration,
        )?,
        renew_deadline: duration(
            "leaderElection.renewDeadline",
            file.renew_deadline,
            d.renew_deadline,
        )?,
        retry_period: duration(
            "leaderElection.retryPeriod",
            file.retry_period,
            d.retry_period,
        )?,
    };
    if !crate::api::is_dns1123_subdomain(&s.lease_name) {
        return Err(ConfigError::Invalid {
            field: "leaderElection.leaseName",
            message: format!(
                "{:?} is not a Lease name (a DNS-1123 subdomain)",
                s.lease_name
            ),
        });
    }
    if s.lease_duration <= s.renew_deadline {
        return Err(ConfigError::Invalid {
            field: "leaderElection.leaseDuration",
            message: format!(
                "{:?} must be longer than renewDeadline ({:?}), so a leader steps down before others may take over",
                s.lease_duration, s.renew_deadline
            ),
        });
    }
    if s.renew_deadline <= s.retry_period.mul_f64(1.2) {
        return Err(ConfigError::Invalid {
            field: "leaderElection.renewDeadline",
            message: format!(
                "{:?} must be longer than 1.2 × retryPeriod ({:?})",
                s.renew_deadline, s.retry_period
            ),
        });
    }
    Ok(s)
}

/// Parses durations as Kubernetes writes them: `250ms`, `10s`, `5m`, `1h30m`, `1.5h`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("{text:?} is not a duration (use e.g. 500ms, 10s, 5m, 1h30m)");
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let value: f64 = rest[..num_len].parse().map_err(|_| bad())?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += value * seconds;
        rest = &rest[unit_len..];
    }
    match Duration::try_from_secs_f64(total) {
        Ok(d) if d <= LONGEST_DURATION => Ok(d),
        Ok(_) => Err(format!(
            "{text:?} is longer than Kubernetes can hold (about 292 years)"
        )),
        Err(_) => Err(bad()),
    }
}

/// Go's time.Duration, and so Kubernetes' durations and CEL's duration(), end at 2^63 − 1 ns
/// (about 292 years): a longer one is refused as the API server refuses it.
pub(crate) const LONGEST_DURATION: Duration = Duration::from_nanos(i64::MAX as u64);

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> ServeArgs {
        ServeArgs {
            dev_tls: Some("/tmp/x".into()),
            ..Default::default()
        }
    }

    #[test]
    fn durations_parse_like_kubernetes() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        for bad in ["", "10", "5 minutes", "s", "1x", "-1s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} must be refused");
        }
        // Go's durations end at 2562047h47m16.854775807s.
        assert_eq!(
            parse_duration("2562047h"),
            Ok(Duration::from_secs(2_562_047 * 3600))
        );
        for long in [
            "2562048h",
            "9223372036854775807s",
            "1e400s",
            "99999999999999999999h",
        ] {
            let e = parse_duration(long).unwrap_err();
            assert!(
                e.contains("longer than Kubernetes can hold") || e.contains("is not a duration"),
                "{long:?}: {e}"
            );
        }
        assert!(parse_duration("9223372036854775807s")
            .unwrap_err()
            .ends_with("is longer than Kubernetes can hold (about 292 years)"));
    }

    #[test]
    fn flags_win_over_file_and_file_over_defaults() {
        let file = FileConfig::parse(
            "listen: 127.0.0.1:1000\nprobeListen: 127.0.0.1:1001\ndefaultQueue: research\nmanagedNamespaces:\n  matchLabels:\n    team: ml\n",
        )
        .unwrap();
        let mut a = args();
        a.listen = Some("127.0.0.1:2000".parse().unwrap());
        let s = ServeSettings::resolve(&a, file).unwrap();
        assert_eq!(s.listen.port(), 2000);
        assert_eq!(s.probe_listen.port(), 1001);
        assert_eq!(s.policy.default_queue.as_deref(), Some("research"));
        assert!(s.policy.managed_namespaces.is_some());
        assert_eq!(
            s.policy.dispatcher_usernames,
            vec![DEFAULT_DISPATCHER_USERNAME]
        );
        assert_eq!(s.tls, TlsSource::Dev("/tmp/x".into()));
    }

    #[test]
    fn manager_settings_have_generous_defaults_and_are_checked() {
        let s = ServeSettings::resolve(&args(), FileConfig::default()).unwrap();
        assert_eq!(s.role, Role::Worker);
        assert!(s.virtual_nodes);
        assert_eq!((s.worker_qps, s.worker_burst), (100.0, 200));
        assert_eq!(s.leader_election, LeaderElectionSettings::default());
        assert_eq!(s.leader_election.lease_name, "switchyard-leader");

        let file = FileConfig::parse(
            "role: manager\nnamespace: fleet\nvirtualNodes: true\nworkerQps: 20\nworkerBurst: 40\nleaderElection:\n  leaseName: sy\n  leaseDuration: 30s\n  renewDeadline: 20s\n  retryPeriod: 4s\n",
        )
        .unwrap();
        let mut a = args();
        a.no_virtual_nodes = true;
        let s = ServeSettings::resolve(&a, file).unwrap();
        assert_eq!(s.role, Role::Manager);
        assert_eq!(s.namespace, "fleet");
        assert!(!s.virtual_nodes, "the flag turns virtual nodes off");
        assert_eq!((s.worker_qps, s.worker_burst), (20.0, 40));
        assert_eq!(s.leader_election.lease_duration, Duration::from_secs(30));
        assert_eq!(s.leader_election.retry_period, Duration::from_secs(4));

        for (yaml, field) in [
            (
                "leaderElection:\n  leaseDuration: 5s\n",
                "leaderElection.leaseDuration",
            ),
            (
                "leaderElection:\n  retryPeriod: 9s\n",
                "leaderElection.renewDeadline",
            ),
            (
                "leaderElection:\n  leaseName: Not_A_Name\n",
                "leaderElection.leaseName",
            ),
            ("workerQps: 0\n", "workerQps"),
            ("workerBurst: 0\n", "workerBurst"),
            ("namespace: Bad_NS\n", "namespace"),
            ("role: manager\ninventory: /x.yaml\n", "inventory"),
        ] {
            let err = ServeSettings::resolve(&args(), FileConfig::parse(yaml).unwrap())
                .unwrap_err()
                .to_string();
            assert!(err.starts_with(field), "{yaml}: {err}");
        }
        let err = FileConfig::parse("leaderElection:\n  leaseNme: x\n").unwrap_err();
        assert!(err.contains("leaseNme"), "{err}");
        assert!(FileConfig::parse("role: boss\n").is_err());
        // Inside the namespace selector too: skipped, `matchLabel` would take every namespace.
        let err = FileConfig::parse("managedNamespaces:\n  matchLabel: {team: a}\n").unwrap_err();
        assert_eq!(err, "managedNamespaces.matchLabel: unknown field");
        FileConfig::parse("managedNamespaces:\n  matchLabels: {team: a}\n").unwrap();
    }

    #[test]
    fn jobsets_are_auto_unless_the_file_says_true_or_false() {
        use crate::dispatcher::live::JobSets;
        let resolve = |yaml: &str| {
            ServeSettings::resolve(&args(), FileConfig::parse(yaml).unwrap())
                .unwrap()
                .jobsets
        };
        assert_eq!(resolve(""), JobSets::Auto);
        assert_eq!(resolve("jobsets: auto\n"), JobSets::Auto);
        assert_eq!(resolve("jobsets: true\n"), JobSets::Enabled);
        assert_eq!(resolve("jobsets: false\n"), JobSets::Disabled);
        let err = FileConfig::parse("jobsets: maybe\n").unwrap_err();
        assert!(err.contains("not auto, true or false"), "{err}");
    }

    #[test]
    fn tls_is_chosen_as_a_unit_and_the_flags_choice_wins() {
        let pair_file = FileConfig::parse("tlsCert: /f/tls.crt\ntlsKey: /f/tls.key\n").unwrap();
        let s = ServeSettings::resolve(&args(), pair_file).unwrap();
        assert_eq!(s.tls, TlsSource::Dev("/tmp/x".into()), "--dev-tls wins");

        let flags_pair = ServeArgs {
            tls_cert: Some("/a/tls.crt".into()),
            tls_key: Some("/a/tls.key".into()),
            ..Default::default()
        };
        let dev_file = FileConfig::parse("devTls: /f/dev\n").unwrap();
        let s = ServeSettings::resolve(&flags_pair, dev_file).unwrap();
        assert_eq!(
            s.tls,
            TlsSource::Files {
                cert: "/a/tls.crt".into(),
                key: "/a/tls.key".into()
            }
        );

        let pair_file = FileConfig::parse("tlsCert: /f/tls.crt\ntlsKey: /f/tls.key\n").unwrap();
        let s = ServeSettings::resolve(&ServeArgs::default(), pair_file).unwrap();
        assert_eq!(
            s.tls,
            TlsSource::Files {
                cert: "/f/tls.crt".into(),
                key: "/f/tls.key".into()
            }
        );

        let refused = |a: &ServeArgs, yaml: &str| {
            ServeSettings::resolve(a, FileConfig::parse(yaml).unwrap())
                .unwrap_err()
                .to_string()
        };
        // One source giving both is refused, whatever the other source says.
        for a in [ServeArgs::default(), args()] {
            let err = refused(&a, "tlsCert: /f/c\ntlsKey: /f/k\ndevTls: /f/dev\n");
            for key in ["tlsCert", "tlsKey", "devTls"] {
                assert!(err.contains(key), "{err}");
            }
        }
        let both_flags = ServeArgs {
            dev_tls: Some("/d".into()),
            ..flags_pair
        };
        let err = refused(&both_flags, "");
        assert!(
            err.contains("--dev-tls") && err.contains("--tls-cert"),
            "{err}"
        );
        // Half a pair, in either source, even when the other source would complete it.
        let err = refused(&ServeArgs::default(), "tlsCert: /f/c\n");
        assert!(
            err.starts_with("tlsKey") && err.contains("tlsCert"),
            "{err}"
        );
        let err = refused(&ServeArgs::default(), "tlsKey: /f/k\ndevTls: /f/dev\n");
        assert!(err.contains("devTls"), "{err}");
        let half_flag = ServeArgs {
            tls_key: Some("/a/k".into()),
            ..Default::default()
        };
        let err = refused(&half_flag, "tlsCert: /f/c\ntlsKey: /f/k\n");
        assert!(
            err.starts_with("--tls-cert") && err.contains("--tls-key"),
            "{err}"
        );
    }

    #[test]
    fn zero_sizes_and_durations_are_refused_by_name() {
        for (yaml, field) in [
            ("maxReviewBytes: 0\n", "maxReviewBytes"),
            ("shutdownTimeout: 0s\n", "shutdownTimeout"),
            ("shutdownTimeout: \"0\"\n", "shutdownTimeout"),
            ("namespaceCacheTtl: 0ms\n", "namespaceCacheTtl"),
            ("staleAfter: 0s\n", "staleAfter"),
            ("inflightTtl: 0s\n", "inflightTtl"),
        ] {
            let err = ServeSettings::resolve(&args(), FileConfig::parse(yaml).unwrap())
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with(field) && err.contains("above 0"),
                "{yaml}: {err}"
            );
        }
        let flag = ServeArgs {
            shutdown_timeout: Some("0s".into()),
            ..args()
        };
        let err = ServeSettings::resolve(&flag, FileConfig::default())
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("shutdownTimeout"), "{err}");
        let s = ServeSettings::resolve(
            &args(),
            FileConfig::parse("maxReviewBytes: 1024\nshutdownTimeout: 1s\nnamespaceCacheTtl: 1s\n")
                .unwrap(),
        )
        .unwrap();
        assert_eq!(s.max_review_bytes, 1024);
        assert_eq!(s.shutdown_timeout, Duration::from_secs(1));
        assert_eq!(s.namespace_cache_ttl, Duration::from_secs(1));
        assert_eq!(s.max_connections, DEFAULT_MAX_CONNECTIONS);
        let few = FileConfig::parse("workers: 4\nmaxConnections: 3\n").unwrap();
        let err = ServeSettings::resolve(&args(), few)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("maxConnections") && err.contains("4 workers"),
            "{err}"
        );
        let s = ServeSettings::resolve(&args(), FileConfig::parse("maxConnections: 64\n").unwrap())
            .unwrap();
        assert_eq!(s.max_connections, 64);
    }

    #[test]
    fn the_namespace_comes_from_the_first_place_that_names_one() {
        let ns = |f, y, p, s| resolve_namespace(f, y, p, s).unwrap();
        assert_eq!(ns(Some("a"), Some("b"), Some("c"), Some("d")), "a");
        assert_eq!(ns(None, Some("b"), Some("c"), Some("d")), "b");
        assert_eq!(ns(None, None, Some("c"), Some("d\n")), "c");
        assert_eq!(ns(None, None, Some(""), Some("d\n")), "d");
        assert_eq!(ns(None, None, None, None), "switchyard-system");
    }

    #[test]
    fn misspelt_keys_and_bad_values_are_reported_by_name() {
        // A byte order mark at the start is read past, not taken for a first document.
        let file = FileConfig::parse("\u{feff}workers: 3\nmaxConnections: 64\n").unwrap();
        assert_eq!((file.workers, file.max_connections), (Some(3), Some(64)));
        let err = FileConfig::parse("defaultQeue: x\n").unwrap_err();
        assert!(err.contains("defaultQeue"), "{err}");
        let file = FileConfig::parse("defaultQueue: Not_A_Label\n").unwrap();
        let err = ServeSettings::resolve(&args(), file)
            .unwrap_err()
            .to_string();
        assert!(err.contains("defaultQueue"), "{err}");
        for interval in ["5m", "1ns", "999ms"] {
            let file = FileConfig::parse(&format!("tlsReloadInterval: {interval}\n")).unwrap();
            let err = ServeSettings::resolve(&args(), file)
                .unwrap_err()
                .to_string();
            assert!(err.contains("must be 1s to 60s"), "{interval}: {err}");
        }
        let err = ServeSettings::resolve(&ServeArgs::default(), FileConfig::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("--dev-tls"), "{err}");
    }
}
