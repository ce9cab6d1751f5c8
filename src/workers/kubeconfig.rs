//! Kubeconfigs for worker clusters: refuse unsafe ones, build a client from the rest.
//!
//! A worker's kubeconfig lives in a Secret (or a mounted file) that the manager reads; anything
//! that would make the manager trust an unverified server, read other files from its own
//! filesystem, or run programs is refused with the `InsecureKubeConfig` reason.

use kube::config::{KubeConfigOptions, Kubeconfig};
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KubeconfigError {
    /// Not a usable kubeconfig at all (`BadKubeConfig`).
    #[error("{0}")]
    Bad(String),
    /// Usable but refused for safety (`InsecureKubeConfig`).
    #[error("{0}")]
    Insecure(String),
}

/// The context the kubeconfig selects: its current context, or its only one.
fn selected(k: &Kubeconfig) -> Result<(&str, &str, Option<&str>), KubeconfigError> {
    let name = match (&k.current_context, k.contexts.as_slice()) {
        (Some(c), _) if !c.is_empty() => c.as_str(),
        (_, [only]) => only.name.as_str(),
        _ => {
            return Err(KubeconfigError::Bad(
                "kubeconfig has no current-context and more or fewer than one context".into(),
            ))
        }
    };
    let ctx = k
        .contexts
        .iter()
        .find(|c| c.name == name)
        .and_then(|c| c.context.as_ref())
        .ok_or_else(|| KubeconfigError::Bad(format!("kubeconfig context {name:?} is missing")))?;
    Ok((name, ctx.cluster.as_str(), ctx.user.as_deref()))
}

/// Why a kubeconfig must not be used, if it must not.
pub fn check(k: &Kubeconfig) -> Result<(), KubeconfigError> {
    let (context, cluster_name, user_name) = selected(k)?;
    let cluster = k
        .clusters
        .iter()
        .find(|c| c.name == cluster_name)
        .and_then(|c| c.cluster.as_ref())
        .ok_or_else(|| {
            KubeconfigError::Bad(format!(
                "context {context:?} names cluster {cluster_name:?}, which the kubeconfig does not define"
            ))
        })?;
    let insecure = |m: String| Err(KubeconfigError::Insecure(m));
    let server = cluster.server.as_deref().unwrap_or("");
    if server.is_empty() {
        return Err(KubeconfigError::Bad(format!(
            "cluster {cluster_name:?} has no server"
        )));
    }
    if !server.starts_with("https://") {
        return insecure(format!(
            "cluster {cluster_name:?} server {server:?} is not https: a worker's API must be reached over TLS"
        ));
    }
    if cluster.insecure_skip_tls_verify == Some(true) {
        return insecure(format!(
            "cluster {cluster_name:?} sets insecure-skip-tls-verify: give certificate-authority-data instead"
        ));
    }
    if cluster.certificate_authority.is_some() {
        return insecure(format!(
            "cluster {cluster_name:?} names a certificate-authority file: embed it as certificate-authority-data"
        ));
    }
    let Some(user_name) = user_name else {
        return Err(KubeconfigError::Bad(format!(
            "context {context:?} has no user: the manager needs credentials for the worker"
        )));
    };
    let user = k
        .auth_infos
        .iter()
        .find(|u| u.name == user_name)
        .and_then(|u| u.auth_info.as_ref())
        .ok_or_else(|| {
            KubeconfigError::Bad(format!(
                "context {context:?} names user {user_name:?}, which the kubeconfig does not define"
            ))
        })?;
    let refuse_path = |field: &str, value: &Option<String>| -> Result<(), KubeconfigError> {
        match value {
            Some(_) => insecure(format!(
                "user {user_name:?} reads {field} from a file on the manager: embed the data instead ({field}-data or token)"
            )),
            None => Ok(()),
        }
    };
    refuse_path("token-file", &user.token_file)?;
    refuse_path("client-certificate", &user.client_certificate)?;
    refuse_path("client-key", &user.client_key)?;
    if user.username.is_some() || user.password.is_some() {
        return insecure(format!(
            "user {user_name:?} uses basic auth (username/password): use a token or a client certificate"
        ));
    }
    if user.exec.is_some() {
        return insecure(format!(
            "user {user_name:?} runs an exec credential plugin, which would run a program inside the manager: use a token or a client certificate"
        ));
    }
    if user.auth_provider.is_some() {
        return insecure(format!(
            "user {user_name:?} uses an auth-provider plugin: use a token or a client certificate"
        ));
    }
    let has_token = user.token.is_some();
    let has_cert = user.client_certificate_data.is_some() && user.client_key_data.is_some();
    if !has_token && !has_cert {
        return Err(KubeconfigError::Bad(format!(
            "user {user_name:?} has neither a token nor client-certificate-data with client-key-data"
        )));
    }
    Ok(())
}

/// How a worker's client is built beyond its kubeconfig.
#[derive(Clone, Default)]
pub struct ClientOptions {
    /// Every request of the client waits for a token of this bucket (`None`: unlimited).
    pub limiter: Option<std::sync::Arc<super::RateLimiter>>,
    /// Where each request's latency is recorded.
    pub latency: Option<prometheus_client::metrics::histogram::Histogram>,
}

/// Parses and checks a kubeconfig, then builds a client for it with bounded timeouts, its
/// requests throttled and timed as `options` say.
pub async fn client_for(
    yaml: &str,
    options: &ClientOptions,
) -> Result<kube::Client, KubeconfigError> {
    let kubeconfig = Kubeconfig::from_yaml(yaml)
        .map_err(|e| KubeconfigError::Bad(format!("kubeconfig does not parse: {e}")))?;
    check(&kubeconfig)?;
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|e| KubeconfigError::Bad(format!("kubeconfig cannot be used: {e}")))?;
    config.connect_timeout = Some(Duration::from_secs(10));
    // Watches hold a request open for minutes; each of ours asks the server to end it sooner.
    config.read_timeout = Some(Duration::from_secs(330));
    config.write_timeout = Some(Duration::from_secs(30));
    let builder = kube::client::ClientBuilder::try_from(config)
        .map_err(|e| KubeconfigError::Bad(format!("kubeconfig cannot be used: {e}")))?;
    let limiter = options
        .limiter
        .clone()
        .unwrap_or_else(|| std::sync::Arc::new(super::RateLimiter::new(f64::MAX, u32::MAX)));
    let layer = super::ratelimit::RateLimitLayer::new(limiter, options.latency.clone());
    Ok(builder.with_layer(&layer).build())
}

/// One cheap request that shows the worker answers: `GET /version`, bounded by `timeout`.
pub async fn probe(client: &kube::Client, timeout: Duration) -> Result<String, String> {
    match tokio::time::timeout(timeout, client.apiserver_version()).await {
        Ok(Ok(info)) => Ok(info.git_version),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {timeout:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
apiVersion: v1
kind: Config
current-context: worker
clusters:
  - name: worker
    cluster:
      server: https://worker.example:6443
      certificate-authority-data: LS0tLS1CRUdJTg==
users:
  - name: switchyard
    user:
      token: abc.def
contexts:
  - name: worker
    context: {cluster: worker, user: switchyard}
"#;

    fn with(replace: &str, by: &str) -> Kubeconfig {
        assert!(GOOD.contains(replace), "{replace}");
        Kubeconfig::from_yaml(&GOOD.replace(replace, by)).unwrap()
    }

    fn insecure(k: &Kubeconfig) -> String {
        match check(k) {
            Err(KubeconfigError::Insecure(m)) => m,
            other => panic!("expected Insecure, got {other:?}"),
        }
    }

    #[test]
    fn a_token_over_https_with_embedded_ca_is_fine() {
        check(&Kubeconfig::from_yaml(GOOD).unwrap()).unwrap();
        let cert = with(
            "token: abc.def",
            "client-certificate-data: Y2VydA==\n      client-key-data: a2V5",
        );
        check(&cert).unwrap();
    }

    #[test]
    fn every_unsafe_kubeconfig_is_refused_with_its_reason() {
        let cases = [
            (with("https://worker", "http://worker"), "not https"),
            (
                with("certificate-authority-data: LS0tLS1CRUdJTg==", "insecure-skip-tls-verify: true"),
                "insecure-skip-tls-verify",
            ),
            (
                with("certificate-authority-data: LS0tLS1CRUdJTg==", "certificate-authority: /etc/ca.crt"),
                "certificate-authority file",
            ),
            (with("token: abc.def", "tokenFile: /var/run/token"), "token-file"),
            (
                with("token: abc.def", "client-certificate: /c.crt\n      client-key-data: a2V5"),
                "client-certificate",
            ),
            (
                with("token: abc.def", "client-certificate-data: Y2VydA==\n      client-key: /k.key"),
                "client-key",
            ),
            (with("token: abc.def", "username: admin\n      password: secret"), "basic auth"),
            (
                with("token: abc.def", "exec:\n        apiVersion: client.authentication.k8s.io/v1\n        command: aws"),
                "exec credential plugin",
            ),
            (
                with("token: abc.def", "auth-provider:\n        name: gcp"),
                "auth-provider",
            ),
        ];
        for (k, reason) in cases {
            let m = insecure(&k);
            assert!(m.contains(reason), "{m:?} should mention {reason:?}");
        }
    }

    #[test]
    fn broken_kubeconfigs_are_bad_not_insecure() {
        for (k, reason) in [
            (
                with("current-context: worker", "current-context: nope"),
                "context \"nope\"",
            ),
            (
                with("context: {cluster: worker", "context: {cluster: other"),
                "does not define",
            ),
            (with("token: abc.def", "{}"), "neither a token"),
        ] {
            match check(&k) {
                Err(KubeconfigError::Bad(m)) => assert!(m.contains(reason), "{m}"),
                other => panic!("expected Bad, got {other:?}"),
            }
        }
    }
}
