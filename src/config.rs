//! `serve` configuration: the YAML file, merged under the command-line flags, resolved into
//! [`ServeSettings`] with every default applied.

use crate::admission::{is_dns1123_label, AdmissionPolicy};
use crate::cli::{LogFormat, ServeArgs};
use crate::selector;
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
pub struct FileConfig {
    pub listen: Option<SocketAddr>,
    pub probe_listen: Option<SocketAddr>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub dev_tls: Option<PathBuf>,
    pub client_ca: Option<PathBuf>,
    pub standalone: Option<bool>,
    pub log_format: Option<LogFormat>,
    pub log: Option<String>,
    pub default_queue: Option<String>,
    pub managed_namespaces: Option<LabelSelector>,
    pub dispatcher_usernames: Option<Vec<String>>,
    pub workers: Option<usize>,
    pub shutdown_timeout: Option<String>,
    pub tls_reload_interval: Option<String>,
    pub max_review_bytes: Option<usize>,
    pub namespace_cache_ttl: Option<String>,
    pub inventory: Option<PathBuf>,
    pub virtual_node_prefix: Option<String>,
    pub numa_unknown: Option<crate::placement::NumaUnknown>,
    pub placement_strategy: Option<crate::placement::Strategy>,
    pub inflight_ttl: Option<String>,
    pub stale_after: Option<String>,
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
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        serde_yaml::from_str(text).map_err(|e| e.to_string())
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
    pub namespace_cache_ttl: Duration,
    /// How long a request body may take to arrive before the request is refused.
    pub body_timeout: Duration,
    /// The inventory file the extender judges nodes against.
    pub inventory: Option<PathBuf>,
    pub extender: crate::extender::ExtenderConfig,
    /// A live inventory silent for this long makes its cluster unschedulable.
    pub stale_after: Duration,
}

/// The ports `serve` listens on unless `listen` and `probeListen` say otherwise.
pub const DEFAULT_HTTPS_PORT: u16 = 9443;
pub const DEFAULT_PROBE_PORT: u16 = 8080;

/// The API server refuses request bodies over 3 MiB, and an UPDATE review carries the object
/// twice (`object` and `oldObject`) plus the envelope: 7 MiB leaves room for both.
pub const DEFAULT_MAX_REVIEW_BYTES: usize = 7 * 1024 * 1024;

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
            namespace_cache_ttl: Duration::from_secs(30),
            body_timeout: Duration::from_secs(10),
            inventory: None,
            extender: Default::default(),
            stale_after: Duration::from_secs(120),
        }
    }

    /// Flags over file over defaults.
    pub fn resolve(args: &ServeArgs, file: FileConfig) -> Result<Self, ConfigError> {
        let tls = match (
            args.tls_cert.clone().or(file.tls_cert),
            args.tls_key.clone().or(file.tls_key),
            args.dev_tls.clone().or(file.dev_tls),
        ) {
            (Some(cert), Some(key), _) => TlsSource::Files { cert, key },
            (None, None, Some(dir)) => TlsSource::Dev(dir),
            (Some(_), None, _) | (None, Some(_), _) => {
                return Err(ConfigError::Invalid {
                    field: "tlsCert/tlsKey",
                    message: "give both the certificate and the key".into(),
                })
            }
            (None, None, None) => {
                return Err(ConfigError::Invalid {
                    field: "tls",
                    message: "serve needs --tls-cert FILE --tls-key FILE, or --dev-tls DIR for a development certificate".into(),
                })
            }
        };
        let default_queue = args.default_queue.clone().or(file.default_queue);
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
        if let Some(sel) = &file.managed_namespaces {
            selector::check(sel).map_err(|message| ConfigError::Invalid {
                field: "managedNamespaces",
                message,
            })?;
        }
        let dispatcher_usernames = if !args.dispatcher_usernames.is_empty() {
            args.dispatcher_usernames.clone()
        } else {
            file.dispatcher_usernames
                .unwrap_or_else(|| vec![DEFAULT_DISPATCHER_USERNAME.into()])
        };
        if dispatcher_usernames.is_empty() {
            return Err(ConfigError::Invalid {
                field: "dispatcherUsernames",
                message: "must name at least one user, or no Job could ever start".into(),
            });
        }
        let duration = |field: &'static str,
                        flag: &Option<String>,
                        file: Option<String>,
                        default: Duration| {
            match flag.clone().or(file) {
                None => Ok(default),
                Some(text) => {
                    parse_duration(&text).map_err(|message| ConfigError::Invalid { field, message })
                }
            }
        };
        let tls_reload_interval = duration(
            "tlsReloadInterval",
            &args.tls_reload_interval,
            file.tls_reload_interval,
            Duration::from_secs(10),
        )?;
        if tls_reload_interval.is_zero() || tls_reload_interval > Duration::from_secs(60) {
            return Err(ConfigError::Invalid {
                field: "tlsReloadInterval",
                message: "must be above 0 and at most 60s, so a renewed certificate is served within a minute".into(),
            });
        }
        let workers = args
            .workers
            .or(file.workers)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, usize::from));
        if workers == 0 {
            return Err(ConfigError::Invalid {
                field: "workers",
                message: "must be at least 1".into(),
            });
        }
        Ok(Self {
            listen: args
                .listen
                .or(file.listen)
                .unwrap_or(([0, 0, 0, 0], DEFAULT_HTTPS_PORT).into()),
            probe_listen: args
                .probe_listen
                .or(file.probe_listen)
                .unwrap_or(([0, 0, 0, 0], DEFAULT_PROBE_PORT).into()),
            tls,
            client_ca: args.client_ca.clone().or(file.client_ca),
            standalone: args.standalone || file.standalone.unwrap_or(false),
            policy: AdmissionPolicy {
                default_queue,
                managed_namespaces: file.managed_namespaces,
                dispatcher_usernames,
            },
            workers,
            shutdown_timeout: duration(
                "shutdownTimeout",
                &args.shutdown_timeout,
                file.shutdown_timeout,
                Duration::from_secs(25),
            )?,
            tls_reload_interval,
            max_review_bytes: file.max_review_bytes.unwrap_or(DEFAULT_MAX_REVIEW_BYTES),
            namespace_cache_ttl: duration(
                "namespaceCacheTtl",
                &None,
                file.namespace_cache_ttl,
                Duration::from_secs(30),
            )?,
            body_timeout: Duration::from_secs(10),
            inventory: args.inventory.clone().or(file.inventory),
            stale_after: duration(
                "staleAfter",
                &None,
                file.stale_after,
                Duration::from_secs(120),
            )?,
            extender: crate::extender::ExtenderConfig {
                engine: crate::placement::EngineConfig {
                    numa_unknown: file.numa_unknown.unwrap_or_default(),
                    strategy: file
                        .placement_strategy
                        .unwrap_or(crate::placement::Strategy::LeastAllocated),
                },
                virtual_node_prefix: file
                    .virtual_node_prefix
                    .unwrap_or_else(|| "switchyard-".into()),
                inflight_ttl: duration(
                    "inflightTtl",
                    &None,
                    file.inflight_ttl,
                    Duration::from_secs(30),
                )?,
            },
        })
    }
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
    Duration::try_from_secs_f64(total).map_err(|_| bad())
}

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
    fn misspelt_keys_and_bad_values_are_reported_by_name() {
        let err = FileConfig::parse("defaultQeue: x\n").unwrap_err();
        assert!(err.contains("defaultQeue"), "{err}");
        let file = FileConfig::parse("defaultQueue: Not_A_Label\n").unwrap();
        let err = ServeSettings::resolve(&args(), file)
            .unwrap_err()
            .to_string();
        assert!(err.contains("defaultQueue"), "{err}");
        let file = FileConfig::parse("tlsReloadInterval: 5m\n").unwrap();
        let err = ServeSettings::resolve(&args(), file)
            .unwrap_err()
            .to_string();
        assert!(err.contains("at most 60s"), "{err}");
        let err = ServeSettings::resolve(&ServeArgs::default(), FileConfig::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("--dev-tls"), "{err}");
    }
}
